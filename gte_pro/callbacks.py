"""Callbacks of our own: training throughput in the progress bar and the logs."""

from __future__ import annotations

import time
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer


class Throughput(Callback):
    """Logs samples/s and real (non-padding) tokens/s of the whole job, smoothed, measured between step ends.

    The interval between two step ends includes data loading and the optimizer, so it is the rate a user gets.
    """

    def __init__(self, smoothing: float = 0.9) -> None:
        self.smoothing = smoothing
        self._last: float | None = None
        self._samples_per_s: float | None = None
        self._tokens_per_s: float | None = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = None  # the gap across validation is not training time

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else self.smoothing * old + (1 - self.smoothing) * new

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None:
            elapsed = max(now - self._last, 1e-9)
            samples = batch["query"]["input_ids"].shape[0] * trainer.world_size
            tokens = batch["num_tokens"]  # counted by the collator on the CPU: no device sync here
            self._samples_per_s = self._smooth(self._samples_per_s, samples / elapsed)
            self._tokens_per_s = self._smooth(self._tokens_per_s, tokens * trainer.world_size / elapsed)
            pl_module.log("train/samples_per_s", self._samples_per_s, prog_bar=True, batch_size=1)
            pl_module.log("train/tokens_per_s", self._tokens_per_s, prog_bar=False, batch_size=1)
        self._last = now
