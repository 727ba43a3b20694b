"""The non-finite guard: an optimizer step whose loss or gradient norm is NaN/inf is skipped, not applied.

One bad batch (a degenerate text, an overflow in a long run) would otherwise write NaN into every weight and the
rest of the run would train nothing. ``ContrastiveModule.optimizer_step`` hands Lightning's closure to
:meth:`NonFiniteGuard.step`, which runs it (training_step + backward, for every micro-batch of the step), then:

- **what counts as non-finite**: any micro-batch's loss of this optimizer step (``observe`` in training_step), or
  the total 2-norm of the gradients after backward, before clipping. With a GradScaler (``precision=16-mixed``)
  only the loss is checked: inf/NaN gradients there are fp16 overflow, which the scaler skips and answers with a
  smaller scale, so the guard does not count them.
- **skipped**: ``optimizer.step`` is not called (no clipping hooks, no update, AdamW's moments and step count stay
  as they were) and the gradients are zeroed. ``train/skipped_steps`` (the run's total so far) is logged every
  step. Lightning still counts the step: ``global_step`` and the step-interval LR scheduler advance, exactly as
  after a GradScaler overflow skip, so ``max_steps``, the schedule's length and a resumed run's step numbers stay
  those of the data seen.
- **stopped**: the skip that would exceed ``loss.max_skipped_steps`` raises :class:`NonFiniteLossError` naming
  the global step (``trainer.global_step`` when the step ran: the optimizer steps before it), the batch's row
  indices (``batch["rows"]``) and the dump written under the run folder: ``nonfinite/step<N>-rank<R>.pt``
  (``torch.save`` of the step's batches on the CPU) and ``.json`` (step, rows, losses, gradient norm).
- **DDP**: every rank must decide alike, or one rank would wait in the next step's collectives forever. The
  gradient norm already agrees (DDP all-reduced the gradients in backward), the losses do not (each rank has its
  own batch), so the flag is all-reduced (max) before it is read: one rank's NaN skips the step on every rank.
- **cost**: one pass over the gradients for their norm (the size of what clipping reads), a one-element
  all-reduce under DDP, and one host sync per optimizer step (reading the flag); nothing per micro-batch.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.utilities import move_data_to_device

from gte_pro.utils.distributed import is_distributed
from gte_pro.utils.files import write_atomic, write_json_atomic
from gte_pro.utils.progress import logs_this_step

log = logging.getLogger(__name__)

DUMP_FOLDER = "nonfinite"


class NonFiniteLossError(RuntimeError):
    """More optimizer steps had a non-finite loss or gradient norm than ``loss.max_skipped_steps`` allows."""


def gradient_norm(params: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Total 2-norm of the parameters' gradients (None when none has one), without a host sync."""
    grads = [p.grad.detach() for p in params if p.grad is not None]
    if not grads:
        return None
    if hasattr(torch.nn.utils, "get_total_norm"):  # torch >= 2.6: foreach kernels per device and dtype
        return torch.nn.utils.get_total_norm(grads, error_if_nonfinite=False)
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g).float() for g in grads]))


def _any_rank(flag: torch.Tensor) -> torch.Tensor:
    """``flag`` (0 or 1) maxed over the ranks, so that every rank reads the same decision."""
    if is_distributed():
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag


def _number(value: float) -> float | str:
    """JSON has no NaN or inf: those are written as strings ("nan", "inf", "-inf")."""
    return value if math.isfinite(value) else str(value)


class NonFiniteGuard:
    """Counts and skips optimizer steps with a non-finite loss or gradient norm (module docstring)."""

    def __init__(self, max_skipped_steps: int = 10) -> None:
        assert max_skipped_steps >= 0, "loss.max_skipped_steps is checked by the config (>= 0)"
        self.max_skipped_steps = int(max_skipped_steps)
        self.skipped = 0
        self._count: torch.Tensor | None = None  # ``skipped`` on the module's device, logged without a sync
        self._reset()

    def state_dict(self) -> dict[str, int]:
        """The count, for checkpoints: a resumed run keeps counting towards the same limit."""
        return {"skipped": self.skipped}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skipped = int(state.get("skipped", 0))
        self._count = None  # re-made with the restored count at the next step

    def _reset(self) -> None:
        self._bad_loss: torch.Tensor | None = None
        self._losses: list[torch.Tensor] = []
        self._batches: list[Any] = []
        self.grad_norm: torch.Tensor | None = None

    # --- per micro-batch ---------------------------------------------------------------------------------------
    def observe(self, batch: Any, loss: torch.Tensor) -> None:
        """Remember a micro-batch of the coming optimizer step and whether its loss is finite (no host sync)."""
        loss = loss.detach()
        bad = torch.isfinite(loss).logical_not().float()
        self._bad_loss = bad if self._bad_loss is None else torch.maximum(self._bad_loss, bad)
        self._losses.append(loss)
        self._batches.append(batch)  # a reference only: copied to the CPU if a dump is written

    # --- per optimizer step ------------------------------------------------------------------------------------
    def nonfinite(self, params: Iterable[torch.Tensor], check_gradients: bool = True) -> bool:
        """Whether any rank saw a non-finite loss (or, with ``check_gradients``, gradient norm) in this step."""
        flags = [] if self._bad_loss is None else [self._bad_loss]
        if check_gradients:
            self.grad_norm = gradient_norm(params)
            if self.grad_norm is not None:
                flags.append(torch.isfinite(self.grad_norm).logical_not().float())
        if not flags:
            return False
        flag = torch.stack([f.to(flags[0].device) for f in flags]).amax()
        return bool(_any_rank(flag).item())  # the one host sync of the step

    def step(self, module: Any, optimizer: Any, closure: Callable[[], Any]) -> None:
        """Lightning's ``optimizer_step``: run the closure, then step only when everything was finite."""
        result = closure()  # training_step + backward; under DDP the gradients are all-reduced when it returns
        params = [p for group in optimizer.param_groups for p in group["params"]]
        # fp16 overflow in the gradients is the GradScaler's job: it skips that step and lowers its scale
        scaler = getattr(module.trainer.precision_plugin, "scaler", None)
        try:
            if self.nonfinite(params, check_gradients=scaler is None):
                optimizer.zero_grad(set_to_none=True)
                self._skip(module)
            else:
                # the precision plugin still runs its part (on_before_optimizer_step, unscaling, clipping) around
                # this closure, which hands back the loss already computed instead of computing it again
                optimizer.step(closure=lambda: result)
            if self._count is None:
                self._count = torch.full((), float(self.skipped), device=module.device)
            if logs_this_step(module.trainer):
                module.log("train/skipped_steps", self._count, on_step=True, on_epoch=False, batch_size=1)
        finally:
            self._reset()

    def _skip(self, module: Any) -> None:
        trainer = module.trainer
        self.skipped += 1
        if self._count is not None:
            self._count.fill_(self.skipped)
        rows = self.rows()
        if self.skipped > self.max_skipped_steps:
            try:
                dump = self.dump(Path(trainer.default_root_dir), trainer.global_step, trainer.global_rank)
                dumped = f"batch dumped to {dump} and {dump.with_suffix('.json')}"
            except OSError as error:  # a full disk must not hide why the run stops
                dumped = f"the batch could not be dumped ({error})"
            raise NonFiniteLossError(
                f"non-finite loss or gradient norm at global step {trainer.global_step} (losses "
                f"{[float(x) for x in self._losses]}, gradient norm {self._norm()}): "
                f"{self.skipped} non-finite steps in this run, more than "
                f"loss.max_skipped_steps={self.max_skipped_steps} allows; batch rows "
                f"{rows if rows is not None else 'unknown'} (rank {trainer.global_rank}); {dumped}")
        log.warning("non-finite loss or gradient norm at global step %d: optimizer step skipped (%d of at most %d "
                    "so far); batch rows %s (rank %d)", trainer.global_step, self.skipped, self.max_skipped_steps,
                    rows, trainer.global_rank)

    # --- reporting (only when a step is skipped: these read values back to the host) ---------------------------
    def rows(self) -> list[int] | None:
        """The training rows of this step's batches (None when the batches do not carry ``rows``)."""
        parts = [batch.get("rows") for batch in self._batches if isinstance(batch, dict)]
        if not parts or any(part is None for part in parts):
            return None
        return [int(row) for part in parts for row in torch.as_tensor(part).flatten().tolist()]

    def _norm(self) -> float | None:
        return None if self.grad_norm is None else float(self.grad_norm)

    def dump(self, folder: Path, global_step: int, rank: int) -> Path:
        """Write this step's batches (``.pt``) and what went wrong (``.json``) under ``folder/nonfinite``."""
        path = folder / DUMP_FOLDER / f"step{global_step:06d}-rank{rank}.pt"
        batches = move_data_to_device(self._batches, "cpu")
        write_atomic(path, lambda tmp: torch.save({"batches": batches, "rows": self.rows()}, tmp), suffix=".pt")
        norm = self._norm()
        write_json_atomic(path.with_suffix(".json"), {
            "global_step": global_step, "rank": rank, "rows": self.rows(),
            "losses": [_number(float(x)) for x in self._losses],
            "gradient_norm": None if norm is None else _number(norm),
            "skipped_steps": self.skipped, "max_skipped_steps": self.max_skipped_steps, "batch_file": path.name,
        })
        return path

