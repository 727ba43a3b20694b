"""Progress of a long step that has no progress bar (building the token cache, embedding a corpus for mining):
an INFO line every ``every_s`` seconds with what is done, the rate and, when the total is known, the time left.
A plain log line rather than a bar, so that SLURM and CI logs show it too."""

from __future__ import annotations

import logging
import time
from typing import Any

log = logging.getLogger("gte_pro.progress")


class Progress:
    """``update(done)`` as the work goes, ``finish(done)`` at the end; only the reporting rank (``quiet=False``)
    writes. ``total``: the amount of work in ``unit`` (None: unknown, no ETA); ``note``: added after the count."""

    def __init__(self, what: str, total: int | None = None, unit: str = "texts", every_s: float = 10.0,
                 quiet: bool = False, note: str = "") -> None:
        self.what, self.total, self.unit, self.every_s, self.quiet, self.note = what, total, unit, every_s, quiet, note
        self.start = self.last = time.perf_counter()

    def update(self, done: int) -> None:
        now = time.perf_counter()
        if self.quiet or now - self.last < self.every_s:
            return
        self.last = now
        rate = done / max(now - self.start, 1e-9)
        if self.total is None:
            log.info("%s: %d %s%s, %.0f %s/s", self.what, done, self.unit, self.note, rate, self.unit)
            return
        log.info("%s: %d / %d %s%s, %.0f %s/s, ETA %.0f s", self.what, done, self.total, self.unit, self.note, rate,
                 self.unit, (self.total - done) / max(rate, 1e-9))

    def finish(self, done: int | None = None) -> None:
        if self.quiet:
            return
        done = self.total if done is None else done
        seconds = time.perf_counter() - self.start
        log.info("%s: %d %s in %.1f s (%.0f %s/s%s)", self.what, done or 0, self.unit, seconds,
                 (done or 0) / max(seconds, 1e-9), self.unit, self.note)


def logs_this_step(trainer: Any) -> bool:
    """Whether Lightning writes this step's metrics to the loggers (every ``trainer.log_every_n_steps`` optimizer
    steps, and the last). A ``self.log`` call costs ~1 ms of host time whether or not it is written: four of them
    were a quarter of a small model's step, which on a GPU is all host time, so the other steps skip them."""
    return bool(getattr(getattr(trainer, "_logger_connector", None), "should_update_logs", True))
