"""Cross-device negatives are exact: 2 gloo processes x batch B train exactly like 1 process x batch 2B."""

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
QUERIES = [f"question {i} about subject {i * 7}" for i in range(BATCH)]
POSITIVES = [f"an answer to question {i}, which covers subject {i * 7} at length" for i in range(BATCH)]
NEGATIVE_TEXTS = [[f"unrelated text {i}-{j} " * (j + 1) for j in range(NEGATIVES)] for i in range(BATCH)]


def _encoder():
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)  # identical initial weights in every process
    return Encoder(packaged_minilm_path(), random_init_config=TINY, max_length=32).double()


def _step(encoder, loss_fn, rows: slice, with_negatives: bool):
    queries = encoder(**encoder.tokenize(QUERIES[rows]))
    positives = encoder(**encoder.tokenize(POSITIVES[rows]))
    negatives = None
    if with_negatives:
        flat = [n for row in NEGATIVE_TEXTS[rows] for n in row]
        negatives = encoder(**encoder.tokenize(flat)).reshape(len(QUERIES[rows]), NEGATIVES, -1)
    return loss_fn(queries, positives, negatives).loss


def _loss(name: str, gather: bool):
    from gte_pro.training.losses import GTELoss, InfoNCELoss

    return {"infonce": InfoNCELoss, "gte": GTELoss}[name](temperature=0.05, gather_across_devices=gather)


class _Step(torch.nn.Module):
    """The whole training step as one forward, as Lightning runs it inside DDP (one DDP forward per backward)."""

    def __init__(self, encoder, loss_fn) -> None:
        super().__init__()
        self.encoder, self.loss_fn = encoder, loss_fn

    def forward(self, rows: slice, with_negatives: bool) -> torch.Tensor:
        return _step(self.encoder, self.loss_fn, rows, with_negatives)


def _rank_main(rank: int, world: int, port: int, name: str, with_negatives: bool, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        encoder = _encoder()
        ddp = torch.nn.parallel.DistributedDataParallel(_Step(encoder, _loss(name, gather=True)))
        share = BATCH // world
        loss = ddp(slice(rank * share, (rank + 1) * share), with_negatives)
        loss.backward()  # DDP averages the parameter gradients over the ranks
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
            torch.save({"loss": mean_loss / world, "grads": grads}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("with_negatives", [False, True], ids=["in-batch", "hard-negatives"])
@pytest.mark.parametrize("name", ["infonce", "gte"])
def test_two_ranks_with_gathered_negatives_equal_one_process_on_the_whole_batch(tmp_path: Path, name, with_negatives):
    out = tmp_path / "ddp.pt"
    mp.spawn(_rank_main, args=(2, free_port(), name, with_negatives, str(out)), nprocs=2, join=True)
    distributed = torch.load(out)

    encoder = _encoder()
    loss = _step(encoder, _loss(name, gather=True), slice(0, BATCH), with_negatives)
    loss.backward()
    assert distributed["loss"].item() == pytest.approx(loss.item(), abs=1e-5)
    grads = {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None}
    assert grads.keys() == distributed["grads"].keys() and len(grads) > 10
    for param_name, grad in grads.items():
        torch.testing.assert_close(distributed["grads"][param_name], grad, atol=1e-5, rtol=1e-5, msg=param_name)


def test_without_gathering_the_ranks_do_not_see_each_others_negatives(tmp_path: Path):
    """The control: local-only negatives give a different (smaller-batch) loss, so the test above can fail."""
    encoder = _encoder()
    whole = _step(encoder, _loss("infonce", gather=False), slice(0, BATCH), False).item()
    halves = [_step(encoder, _loss("infonce", gather=False), rows, False).item()
              for rows in (slice(0, BATCH // 2), slice(BATCH // 2, BATCH))]
    assert abs(sum(halves) / 2 - whole) > 1e-3
