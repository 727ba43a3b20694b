"""Preemption on SLURM: submitit's signal -> every rank saves ``last.ckpt`` at an agreed step -> requeue."""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer

log = logging.getLogger(__name__)


def submitit_signal() -> int:
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def under_submitit() -> bool:
    """True inside a job that submitit started (its SLURM and local executors both export this)."""
    return "SUBMITIT_EXECUTOR" in os.environ


class PreemptionCheckpoint(Callback):
    """On the preemption signal (SIGUSR2), every rank sets a flag; at the next step boundary the ranks agree
    (one tiny all-reduce every ``check_every_n_steps``), all save ``last.ckpt`` together, and then rank 0
    hands over to submitit's own handler, which calls the launcher's ``checkpoint()`` and requeues the job.
    Saving from inside the signal handler could deadlock DDP (one rank in a barrier, one in an all-reduce).
    """

    def __init__(self, output_dir: Path, check_every_n_steps: int = 5) -> None:
        self.output_dir = output_dir
        self.check_every_n_steps = check_every_n_steps
        self._requested = False
        self._submitit_handler: Any = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        signum = submitit_signal()
        self._submitit_handler = signal.getsignal(signum)
        signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: Any) -> None:
        log.warning("preemption signal %s received: checkpointing at the next step", signum)
        self._requested = True

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if trainer.global_step % self.check_every_n_steps:
            return
        if not trainer.strategy.reduce_boolean_decision(self._requested, all=False):
            return
        path = self.output_dir / "checkpoints" / "last.ckpt"
        trainer.save_checkpoint(path)
        log.warning("preempted at step %d: saved %s", trainer.global_step, path)
        if trainer.is_global_zero and callable(self._submitit_handler):
            self._submitit_handler(submitit_signal(), None)  # requeues this job, then exits
        time.sleep(120)  # other ranks: wait for SLURM to stop the job step after the requeue
        sys.exit(0)
