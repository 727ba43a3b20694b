"""The distillation losses under DDP: 2 gloo processes x batch B (each with its rows' teacher scores) train exactly like
1 process x batch 2B, with and without GradCache (loss.mini_batch_size), the InfoNCE term gathered across ranks.

Every slot has a teacher score here: with unscored (NaN) slots each rank averages over its own scored slots, which
equals the global mean only when the ranks hold equally many (see gte_pro/training/losses_distill.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gte_pro import packaged_minilm_path
from tests.conftest import free_port

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
BATCH, NEGATIVES = 6, 2  # global batch; each of the 2 ranks gets 3 queries
ROWS = [(f"question {i} about subject {i * 7}", f"an answer to question {i}, which covers subject {i * 7} at length",
         [f"unrelated text {i}-{j} " * (j + 1) for j in range(NEGATIVES)]) for i in range(BATCH)]
TEACHER = torch.tensor([[3.0 - 0.1 * i, 1.0 + 0.2 * i, -0.5 * i] for i in range(BATCH)], dtype=torch.float64)


def _encoder():
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)  # identical initial weights in every process
    return Encoder(packaged_minilm_path(), random_init_config=TINY, max_length=32).double()


def _loss(name: str, mini_batch_size: int | None):
    from gte_pro.training.losses_distill import DistillKLLoss, MarginMSELoss

    return {"distill_kl": DistillKLLoss, "margin_mse": MarginMSELoss}[name](
        temperature=0.05, weight_infonce=0.5, mini_batch_size=mini_batch_size)


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


class _Step(torch.nn.Module):
    """The whole training step as one forward, as Lightning runs it inside DDP."""

    def __init__(self, encoder, loss_fn) -> None:
        super().__init__()
        self.encoder, self.loss_fn = encoder, loss_fn

    def forward(self, rows: slice) -> torch.Tensor:
        return _step(self.encoder, self.loss_fn, rows)


def _rank_main(rank: int, world: int, port: int, name: str, mini_batch_size: int | None, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        encoder = _encoder()
        ddp = torch.nn.parallel.DistributedDataParallel(_Step(encoder, _loss(name, mini_batch_size)))
        share = BATCH // world
        loss = ddp(slice(rank * share, (rank + 1) * share))
        loss.backward()  # DDP averages the parameter gradients over the ranks
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
            torch.save({"loss": mean_loss / world, "grads": grads}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("mini_batch_size", [None, 2], ids=["uncached", "gradcache"])
@pytest.mark.parametrize("name", ["distill_kl", "margin_mse"])
def test_two_ranks_equal_one_process_on_the_whole_batch(tmp_path: Path, name, mini_batch_size):
    out = tmp_path / "ddp.pt"
    mp.spawn(_rank_main, args=(2, free_port(), name, mini_batch_size, str(out)), nprocs=2, join=True)
    distributed = torch.load(out)

    encoder = _encoder()
    loss = _step(encoder, _loss(name, None), slice(0, BATCH))
    loss.backward()
    assert distributed["loss"].item() == pytest.approx(loss.item(), abs=1e-6, rel=1e-6)
    grads = {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None}
    assert grads.keys() == distributed["grads"].keys() and len(grads) > 10
    for param_name, grad in grads.items():
        assert grad.abs().max() > 0, param_name
        torch.testing.assert_close(distributed["grads"][param_name], grad, atol=1e-6, rtol=1e-6, msg=param_name)
