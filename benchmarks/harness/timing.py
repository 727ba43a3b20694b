"""Peak memory (RSS from /proc, allocations on CUDA) and timing (wall and CPU seconds, the device synchronised)."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MB = 2**20


def proc_kb(field: str, file: str = "/proc/self/status") -> int:
    """A ``kB`` field of a /proc file: VmRSS, VmHWM (peak RSS) of /proc/self/status, MemAvailable of /proc/meminfo."""
    for line in Path(file).read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in {file}")


def _cuda() -> Any:
    """torch.cuda when this process has imported torch and has a GPU; importing torch just to ask would cost
    seconds in processes that never touch it (the parents, bench_scale)."""
    torch = sys.modules.get("torch")
    return torch.cuda if torch is not None and torch.cuda.is_available() else None


def peak_memory() -> dict[str, float | None]:
    """This process's peak RSS (MB, VmHWM) and, on CUDA, its peak allocated GPU memory (MB; None without CUDA)."""
    cuda = _cuda()
    return {"peak_rss_mb": proc_kb("VmHWM") / 1024, "peak_gpu_mb": cuda.max_memory_allocated() / MB if cuda else None}


class PeakMemory:
    """Peak memory of a code region above what was in use when it started (bytes): the peak RSS on CPU, the peak
    allocation on CUDA."""

    def __init__(self, device_type: str) -> None:
        self.cuda = _cuda() if device_type == "cuda" else None
        self.base = 0

    def start(self) -> None:
        if self.cuda:
            self.cuda.synchronize()
            self.cuda.reset_peak_memory_stats()
            self.base = self.cuda.memory_allocated()
            return
        self.base = proc_kb("VmRSS") * 1024
        # "5" resets the peak RSS (VmHWM) to the current RSS: the peak of the region, not of what came before
        Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> tuple[int, int]:
        """(peak above the start, absolute peak)."""
        if self.cuda:
            self.cuda.synchronize()
            peak = self.cuda.max_memory_allocated()
        else:
            peak = proc_kb("VmHWM") * 1024
        return peak - self.base, peak


def clock() -> float:
    """``perf_counter`` once the GPU has finished the work queued so far (kernels run asynchronously)."""
    if cuda := _cuda():
        cuda.synchronize()
    return time.perf_counter()


@dataclass
class Timing:
    wall_s: float = 0.0
    cpu_s: float = 0.0  # all threads of this process: on a shared machine, wall time also measures the neighbours


@contextmanager
def timed() -> Iterator[Timing]:
    """Wall and CPU seconds of a block, the device synchronised at both ends."""
    timing = Timing()
    start, cpu_start = clock(), time.process_time()
    yield timing
    timing.wall_s, timing.cpu_s = clock() - start, time.process_time() - cpu_start
