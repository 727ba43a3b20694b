"""Two gloo ranks against one process, for the exactness tests of the losses under DDP (tests/test_distributed.py,
tests/test_distill_ddp.py).

``two_ranks_and_one(tmp_path, step, batch)`` runs ``step(encoder, rows)`` (the whole training step, returning the
loss) inside DistributedDataParallel on 2 processes, each on its half of the rows, and once on all rows in this
process (or ``single`` there); it returns the ranks' mean loss and rank 0's (DDP-averaged) gradients, and the
single process's loss and gradients. ``step`` must pickle (a module-level function, or a ``functools.partial``).
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from gte_pro import packaged_minilm_path
from tests.conftest import free_port

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
Step = Callable[[Any, slice], torch.Tensor]


def tiny_encoder() -> Any:
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)  # identical initial weights in every process
    return Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=32).double()


class _Step(torch.nn.Module):
    """The whole training step as one forward, as Lightning runs it inside DDP (one DDP forward per backward)."""

    def __init__(self, encoder: Any, step: Step) -> None:
        super().__init__()
        self.encoder, self.step = encoder, step

    def forward(self, rows: slice) -> torch.Tensor:
        return self.step(self.encoder, rows)


def _rank_main(rank: int, world: int, port: int, step: Step, batch: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    # a bounded wait: a rank that fails leaves the other at a collective for this long, not for 30 minutes
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        encoder = tiny_encoder()
        ddp = torch.nn.parallel.DistributedDataParallel(_Step(encoder, step))
        share = batch // world
        loss = ddp(slice(rank * share, (rank + 1) * share))
        loss.backward()  # DDP averages the parameter gradients over the ranks
        mean_loss = loss.detach().clone()
        dist.all_reduce(mean_loss)
        if rank == 0:
            grads = {n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None}
            torch.save({"loss": mean_loss / world, "grads": grads}, out)
        # both ranks leave together: a rank that tears its gloo group down while the other is still saving was seen
        # to leave that one waiting for ever (2026-12-06, one run in several)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def two_ranks_and_one(tmp_path: Path, step: Step, batch: int,
                      single: Step | None = None) -> tuple[dict[str, Any], float, dict[str, Any]]:
    """(the 2 ranks' {"loss", "grads"}, the single process's loss, its gradients by parameter name); ``single``: the
    step the single process runs, if not ``step`` itself (e.g. without GradCache)."""
    out = tmp_path / "ddp.pt"
    spawn_ranks(_rank_main, (2, free_port(), step, batch, str(out)), tmp_path)
    encoder = tiny_encoder()
    loss = (single or step)(encoder, slice(0, batch))
    loss.backward()
    grads = {n: p.grad for n, p in encoder.named_parameters() if p.grad is not None}
    return torch.load(out), loss.item(), grads


def _watched(rank: int, fn: Callable[..., None], stacks_after_s: float, done_dir: str, *args: Any) -> None:
    """``fn(rank, *args)`` with its stacks printed (and the process ended) if it is still running after
    ``stacks_after_s``; a file in ``done_dir`` says that it returned."""
    faulthandler.dump_traceback_later(stacks_after_s, exit=True)
    fn(rank, *args)
    faulthandler.cancel_dump_traceback_later()
    Path(done_dir, str(rank)).touch()


def spawn_ranks(fn: Callable[..., None], args: tuple, tmp_path: Path, *, world: int = 2,
                deadline_s: float = 240.0) -> None:
    """``fn(rank, *args)`` on ``world`` spawned processes, as ``mp.spawn(..., join=True)`` but never waiting for ever.

    A rank still inside ``fn`` after ``deadline_s`` prints its Python stacks to the test's stderr and exits, so the
    test fails with where it hung (in CI one such wait once ran into the job's 90-minute limit, 2026-12-06). Ranks that
    all returned from ``fn`` but do not exit (a gloo teardown at interpreter exit) are ended after a grace period:
    what they computed is on disk already.
    """
    done_dir = tmp_path / f"ranks-done-{time.monotonic_ns()}"
    done_dir.mkdir()
    context = mp.start_processes(_watched, args=(fn, deadline_s, str(done_dir), *args), nprocs=world, join=False,
                                 start_method="spawn")
    give_up = time.monotonic() + deadline_s + 30
    all_returned_at = None
    while not context.join(timeout=2):
        if all_returned_at is None and len(list(done_dir.iterdir())) == world:
            all_returned_at = time.monotonic()
        if all_returned_at is not None and time.monotonic() > all_returned_at + 30:
            _end(context)
            print(f"spawn_ranks: the {world} ranks returned but had not exited 30 s later; ended them", file=sys.stderr)
            return
        if time.monotonic() > give_up:
            _end(context)
            raise TimeoutError(f"{world} ranks still running after {deadline_s + 30:.0f} s (stacks above, on stderr)")


def _end(context: Any) -> None:
    for process in context.processes:
        if process.is_alive():
            process.kill()
        process.join(5)


def loss_ranks_main(rank: int, world: int, port: int, out: str, batch: int, options: dict[str, tuple],
                    loss_and_grads: Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]) -> None:
    """A loss on raw embeddings over 2 gloo ranks (for ``spawn_ranks``): for each of ``options`` (name -> the
    arguments after the row slice of ``loss_and_grads(rows, *args)``), each rank computes the loss and gradients of
    its share of ``batch`` rows; rank 0 saves ``{name: {"loss": mean over ranks, "grads": every rank's, in rank
    order}}`` to ``out``."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        share = batch // world
        results = {}
        for name, args in options.items():
            loss, grads = loss_and_grads(slice(rank * share, (rank + 1) * share), *args)
            loss = loss.detach().clone()
            dist.all_reduce(loss)
            gathered = []
            for grad in grads:  # every rank's gradients, in rank order: the whole batch's
                parts = [torch.empty_like(grad) for _ in range(world)]
                dist.all_gather(parts, grad.contiguous())
                gathered.append(torch.cat(parts))
            results[name] = {"loss": loss / world, "grads": gathered}
        if rank == 0:
            torch.save(results, out)
    finally:
        dist.destroy_process_group()



def assert_ranks_equal_one_process(tmp_path: Path, batch: int, options: dict[str, tuple],
                                   loss_and_grads: Callable[..., tuple[torch.Tensor, list[torch.Tensor]]]) -> dict:
    """Each of ``options`` over 2 gloo ranks (``loss_ranks_main``) gives one process's loss on the whole ``batch``,
    and every rank's gradients (of the mean over ranks: half of each) its gradients; returns the ranks' results."""
    out = tmp_path / "ddp.pt"
    spawn_ranks(loss_ranks_main, (2, free_port(), str(out), batch, options, loss_and_grads), tmp_path)
    distributed = torch.load(out)
    for key, args in options.items():
        loss, grads = loss_and_grads(slice(0, batch), *args)
        assert abs(distributed[key]["loss"].item() - loss.item()) <= 1e-12 * abs(loss.item()), key
        for mine, theirs in zip(distributed[key]["grads"], grads, strict=True):
            torch.testing.assert_close(mine / 2, theirs, rtol=1e-10, atol=1e-12, msg=key)
    return distributed
