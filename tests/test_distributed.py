"""Cross-device negatives are exact: 2 gloo processes x batch B train exactly like 1 process x batch 2B."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import torch

from tests.ddp_harness import tiny_encoder, two_ranks_and_one

BATCH, NEGATIVES = 6, 2  # global batch; each of the 2 ranks gets 3 queries
QUERIES = [f"question {i} about subject {i * 7}" for i in range(BATCH)]
POSITIVES = [f"an answer to question {i}, which covers subject {i * 7} at length" for i in range(BATCH)]
NEGATIVE_TEXTS = [[f"unrelated text {i}-{j} " * (j + 1) for j in range(NEGATIVES)] for i in range(BATCH)]


def _step(encoder, loss_fn, rows: slice, with_negatives: bool):
    queries = encoder(**encoder.tokenize(QUERIES[rows]))
    positives = encoder(**encoder.tokenize(POSITIVES[rows]))
    negatives = None
    if with_negatives:
        flat = [n for row in NEGATIVE_TEXTS[rows] for n in row]
        negatives = encoder(**encoder.tokenize(flat)).reshape(len(QUERIES[rows]), NEGATIVES, -1)
    return loss_fn(queries, positives, negatives).loss


def _loss(name: str, gather: bool):
    from gte_pro.config.defaults import default_loss

    return default_loss(name, temperature=0.05, gather_across_devices=gather)


def _ddp_step(name: str, with_negatives: bool, encoder, rows: slice) -> torch.Tensor:
    return _step(encoder, _loss(name, gather=True), rows, with_negatives)


@pytest.mark.parametrize("with_negatives", [False, True], ids=["in-batch", "hard-negatives"])
@pytest.mark.parametrize("name", ["infonce", "gte"])
def test_two_ranks_with_gathered_negatives_equal_one_process_on_the_whole_batch(tmp_path: Path, name, with_negatives):
    distributed, loss, grads = two_ranks_and_one(tmp_path, partial(_ddp_step, name, with_negatives), BATCH)
    assert distributed["loss"].item() == pytest.approx(loss, abs=1e-5)
    assert grads.keys() == distributed["grads"].keys() and len(grads) > 10
    for param_name, grad in grads.items():
        torch.testing.assert_close(distributed["grads"][param_name], grad, atol=1e-5, rtol=1e-5, msg=param_name)


def test_without_gathering_the_ranks_do_not_see_each_others_negatives(tmp_path: Path):
    """The control: local-only negatives give a different (smaller-batch) loss, so the test above can fail."""
    encoder = tiny_encoder()
    whole = _step(encoder, _loss("infonce", gather=False), slice(0, BATCH), False).item()
    halves = [_step(encoder, _loss("infonce", gather=False), rows, False).item()
              for rows in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH))]
    assert abs(sum(halves) / 2 - whole) > 1e-3
