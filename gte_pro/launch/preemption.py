"""Preemption on SLURM (submitit's signal -> every rank saves ``last.ckpt`` at an agreed step -> requeue), and the
same path for SIGTERM/SIGINT (-> ``last.ckpt`` at an agreed step -> exit 143/130; ``gte_pro.launch.stop``)."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

from gte_pro.errors import RunStopped
from gte_pro.launch.stop import STOP, STOP_SIGNALS, deferring, under_submitit

log = logging.getLogger(__name__)


def submitit_signal() -> int:
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


class PreemptionCheckpoint(Callback):
    """Checkpoint at an agreed step, then stop: on SLURM's preemption signal (SIGUSR2 under submitit) and on SIGTERM
    or SIGINT (``gte_pro.launch.stop``). A rank that receives one sets a flag; at the next step boundary the ranks
    agree (one tiny all-reduce every ``check_every_n_steps`` steps, every step in a single process), all save
    ``last.ckpt`` together, and then:

    - preemption: rank 0 hands over to submitit's own handler, which calls the launcher's ``checkpoint()`` and
      requeues the job;
    - SIGTERM/SIGINT: every rank raises ``RunStopped`` (exit code 143/130) naming the checkpoint.

    Saving from inside the signal handler could deadlock DDP (one rank in a barrier, one in an all-reduce).
    """

    def __init__(self, output_dir: Path, check_every_n_steps: int = 5) -> None:
        self.output_dir = output_dir
        self.check_every_n_steps = check_every_n_steps
        self._requested = False
        self._submitit_handler: Any = None
        self._deferring: contextlib.ExitStack | None = None
        self._step_seen = -1
        self._agreed: bool | None = None  # the ranks agreed to stop (True: preempted, False: SIGTERM/SIGINT)

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if under_submitit():
            signum = submitit_signal()
            self._submitit_handler = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._step_seen = trainer.global_step
        # Lightning installed its own SIGTERM handler just before (it raises SIGTERMException, which exits 0
        # without a checkpoint): ours replaces it until Lightning's teardown restores the job's handler
        self._deferring = contextlib.ExitStack()
        self._deferring.enter_context(deferring())
        for signum in STOP_SIGNALS:
            signal.signal(signum, STOP.handle)

    def _agree(self, trainer: Trainer) -> bool | None:
        """Every ``check_every_n_steps`` steps (every step in one process), whether any rank was asked to stop: None
        (no), True (preempted) or False (SIGTERM/SIGINT). A collective: every rank calls it at the same steps."""
        every = self.check_every_n_steps if trainer.world_size > 1 else 1
        if trainer.global_step % every:
            return None
        strategy = trainer.strategy
        if not strategy.reduce_boolean_decision(self._requested or STOP.signum is not None, all=False):
            return None
        return bool(strategy.reduce_boolean_decision(self._requested, all=False))  # every rank asks: agreed above

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._stop_deferring()

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._stop_deferring()

    def _stop_deferring(self) -> None:
        if self._deferring is not None:
            self._deferring.close()
            self._deferring = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.warning("preemption signal %s received: checkpointing at the next step", signum)
        self._requested = True

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        stepped = trainer.global_step != self._step_seen  # False inside gradient accumulation: no boundary
        self._step_seen = trainer.global_step
        if not stepped:
            return
        if self._agreed is None:
            self._agreed = self._agree(trainer)
        if self._agreed is None:
            return
        if trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            return  # a validation is due: saving before it would resume as if it had run (LastCheckpoint's rule)
        if trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            return  # an epoch's last batch: save at the next step (gte_pro.training.callbacks.ends_epoch says why)
        preempted, self._agreed = self._agreed, None
        path = self.output_dir / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path)
        if not preempted:
            signum = STOP.take() or signal.SIGTERM  # a rank the signal did not reach stops with the one that got it
            raise RunStopped(signum, f"{path} (step {trainer.global_step})")
        log.warning("preempted at step %d: saved %s", trainer.global_step, path)
        if trainer.is_global_zero and callable(self._submitit_handler):
            self._submitit_handler(submitit_signal(), None)  # requeues this job, then exits
        time.sleep(120)  # other ranks: wait for SLURM to stop the job step after the requeue
        sys.exit(0)


def stop_if_asked(trainer: Trainer) -> None:
    """After ``trainer.fit``: a signal received during the last steps (no step boundary was left to stop at) stops
    the run now, on every rank (one all-reduce); the end-of-training ``last.ckpt`` holds those steps."""
    if trainer.strategy.reduce_boolean_decision(STOP.signum is not None, all=False):
        raise RunStopped(STOP.take() or signal.SIGTERM)
