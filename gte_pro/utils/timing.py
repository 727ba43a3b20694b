"""Where a run's wall time and memory go: seconds per phase (start-up, setup, validation, training, exports), printed
at the end of a run and kept in ``metrics.json`` under ``timing``, and the process's peak RSS when each phase ended
(``peak_rss_mb``): the phase whose figure jumps is the one that needed the memory. The peak is the process's: the
later jobs of a sweep, which share the process, start from the earlier jobs' peak."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Iterator
from typing import Any

_first_job_in_process = True


def _seconds_since_process_start() -> float | None:
    try:
        import psutil

        return time.time() - psutil.Process().create_time()
    except Exception:  # noqa: BLE001 - no psutil, or a platform without process start times: leave it out
        return None


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MB (ru_maxrss is in kB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def peak_rss_mb_per_rank() -> list[float]:
    """Each rank's peak resident memory in MB (collective under torch.distributed): what a corpus costs a
    process."""
    import torch.distributed as dist

    from gte_pro.utils.distributed import is_distributed, world

    peak = peak_rss_mb()
    if not is_distributed():
        return [peak]
    peaks: list[Any] = [None] * world()[1]
    dist.all_gather_object(peaks, peak)
    return peaks


class PhaseTimes:
    """Seconds per named phase, in the order the phases first ran. ``start-up`` (interpreter start, imports and
    config composition up to this object) is counted for the first job of a process only: a sweep's later jobs
    share the process."""

    def __init__(self) -> None:
        global _first_job_in_process
        self.seconds: dict[str, float] = {}
        self.peak_rss_mb: dict[str, float] = {}
        startup = _seconds_since_process_start() if _first_job_in_process else None
        _first_job_in_process = False
        if startup is not None:
            self.seconds["start-up"] = startup
        self._created = time.perf_counter()
        self._startup = startup or 0.0

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
            self.peak_rss_mb[name] = round(peak_rss_mb(), 1)

    def record(self) -> dict[str, float]:
        """Each phase's seconds, ``other`` (the time between phases) and ``total``."""
        total = self._startup + time.perf_counter() - self._created
        other = total - sum(self.seconds.values())
        return {**{name: round(s, 2) for name, s in self.seconds.items()}, "other": round(max(other, 0.0), 2),
                "total": round(total, 2)}

    def line(self) -> str:
        times = " | ".join(f"{name} {seconds:.1f} s" for name, seconds in self.record().items())
        peaks = " | ".join(f"{name} {mb / 1024:.2f} GiB" for name, mb in self.peak_rss_mb.items())
        return f"wall time: {times}\npeak RSS at the end of: {peaks}"
