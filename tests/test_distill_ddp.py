"""The distillation losses under DDP: 2 gloo processes x batch B (each with its rows' teacher scores) train exactly like
1 process x batch 2B, with and without GradCache (loss.mini_batch_size), the InfoNCE term gathered across ranks.

Every slot has a teacher score here: with unscored (NaN) slots each rank averages over its own scored slots, which
equals the global mean only when the ranks hold equally many (see gte_pro/training/losses/distillation.py)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from tests.ddp_harness import two_ranks_and_one

BATCH, NEGATIVES = 6, 2  # global batch; each of the 2 ranks gets 3 queries
ROWS = [(f"question {i} about subject {i * 7}", f"an answer to question {i}, which covers subject {i * 7} at length",
         [f"unrelated text {i}-{j} " * (j + 1) for j in range(NEGATIVES)]) for i in range(BATCH)]
TEACHER = torch.tensor([[3.0 - 0.1 * i, 1.0 + 0.2 * i, -0.5 * i] for i in range(BATCH)], dtype=torch.float64)


def _loss(name: str, mini_batch_size: int | None):
    from gte_pro.config.defaults import default_loss

    return default_loss(name, temperature=0.05, weight_infonce=0.5, mini_batch_size=mini_batch_size)


def _step(encoder, loss_fn, rows: slice) -> torch.Tensor:
    from gte_pro.data.collate import PairCollator
    from gte_pro.training.gradcache import cached_loss
    from gte_pro.training.losses import split_documents

    batch = PairCollator(encoder.tokenizer, 32)(ROWS[rows])
    teacher = TEACHER[rows]
    if loss_fn.mini_batch_size:
        return cached_loss(encoder, loss_fn, batch["query"], batch["doc"], NEGATIVES, loss_fn.mini_batch_size,
                           teacher_scores=teacher).loss
    query = encoder(**batch["query"])
    positives, negatives = split_documents(encoder(**batch["doc"]), query.shape[0], NEGATIVES)
    return loss_fn(query, positives, negatives, teacher_scores=teacher).loss


def _ddp_step(name: str, mini_batch_size: int | None, encoder, rows: slice) -> torch.Tensor:
    return _step(encoder, _loss(name, mini_batch_size), rows)


@pytest.mark.parametrize("mini_batch_size", [None, 2], ids=["uncached", "gradcache"])
@pytest.mark.parametrize("name", ["distill_kl", "margin_mse"])
def test_two_ranks_equal_one_process_on_the_whole_batch(tmp_path: Path, name, mini_batch_size):
    # the single process runs uncached: GradCache on the ranks must give the plain step's loss and gradients
    distributed, loss, grads = two_ranks_and_one(tmp_path, partial(_ddp_step, name, mini_batch_size), BATCH,
                                                 single=partial(_ddp_step, name, None))
    assert distributed["loss"].item() == pytest.approx(loss, abs=1e-6, rel=1e-6)
    assert grads.keys() == distributed["grads"].keys() and len(grads) > 10
    for param_name, grad in grads.items():
        assert grad.abs().max() > 0, param_name
        torch.testing.assert_close(distributed["grads"][param_name], grad, atol=1e-6, rtol=1e-6, msg=param_name)
