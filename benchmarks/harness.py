"""What every benchmark here shares: fresh child processes, interleaved rounds, medians, peak memory, timing, the
markdown table and the JSON file. The ``bench_*.py`` files only say what they measure.

A measurement that must not share a process with the others (peak memory is per process; a crash, the OOM killer or
a hang must not take the other measurements with it) runs through ``run_child(function, payload, work)``: a fresh
``python harness.py --child FILE FUNCTION PAYLOAD RESULT`` imports the benchmark file, calls ``function(payload)``
and writes its dict as JSON. A failure of any kind comes back as ``{"error": reason, "log_tail": ...}``.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gte_pro.utils.tables import markdown_table

MB = 2**20
Result = dict[str, Any]  # one measurement; ``{"error": reason, ...}`` when it failed
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # defaults; the caller's environment wins
_POLL_S = 0.05


# --- child processes ----------------------------------------------------------------------------------------------
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def failure_reason(returncode: int, output: str) -> str:
    """A one-line reason from a child's exit status and its output: the signal, or the last exception line."""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"killed by signal {-returncode} {name}{hint}"
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1] if lines else "no output")
    return f"exit code {returncode}: {cause[:240]}"


def _wait(proc: subprocess.Popen, timeout: float | None) -> tuple[int | None, float]:
    """(exit code, or None when killed at ``timeout``; the child's peak RSS in MB). ``wait4`` rather than
    ``Popen.wait``: it also returns the child's resource usage, hence its peak RSS from outside."""
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, 0 if timed_out else os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for a reaped child
            return (None if timed_out else proc.returncode), usage.ru_maxrss / 1024
        if deadline is not None and time.monotonic() > deadline:
            with suppress(ProcessLookupError):  # it may have exited since the poll
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
            timed_out = True
            continue
        time.sleep(_POLL_S)


def run_command(cmd: Sequence[str], log: Path, timeout: float | None = None, cwd: Path | None = None,
                env: Mapping[str, str] | None = None) -> Result:
    """Run ``cmd`` (stdout and stderr to ``log``): ``{"wall_s", "peak_rss_mb"}`` or ``{"error", "log_tail"}``."""
    full_env = {**CHILD_ENV, **os.environ, **(env or {})}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code, peak_rss = _wait(proc, timeout)
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace")[-3000:]
    if code is None:
        return {"error": f"timed out after {timeout:g} s", "log_tail": tail}
    if code:
        return {"error": failure_reason(code, tail), "log_tail": tail}
    return {"wall_s": wall, "peak_rss_mb": peak_rss}


def run_child(function: Callable[[dict[str, Any]], Result], payload: Mapping[str, Any], work: Path,
              timeout: float | None = None) -> Result:
    """``function(payload)`` in a fresh process; its result, or ``{"error": reason, "log_tail": ...}``.

    ``function`` must be a module-level function of a file the child can import by path (a benchmark script)."""
    fd, name = tempfile.mkstemp(suffix=".json", dir=work)
    os.close(fd)
    result_file, log = Path(name), Path(name).with_suffix(".log")
    cmd = [sys.executable, __file__, "--child", inspect.getfile(function), function.__name__,
           json.dumps(dict(payload)), str(result_file)]
    outcome = run_command(cmd, log, timeout)
    text, tail = result_file.read_text(), log.read_text(errors="replace")[-3000:]
    result_file.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    if "error" in outcome:
        return outcome
    if not text:  # exit code 0 without a result: something ended the child before the function returned
        return {"error": failure_reason(0, tail), "log_tail": tail}
    return json.loads(text)


def _child_main(file: str, function: str, payload: str, result_file: str) -> None:
    spec = importlib.util.spec_from_file_location(Path(file).stem, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses and pickling look modules up by name
    spec.loader.exec_module(module)
    result = getattr(module, function)(json.loads(payload))
    Path(result_file).write_text(json.dumps(result))


# --- rounds and statistics ----------------------------------------------------------------------------------------
def interleave(names: Sequence[str], rounds: int, measure: Callable[[str, int], Result],
               describe: Callable[[Result], str] | None = None) -> dict[str, list[Result]]:
    """``measure(name, round)`` for A B C, A B C, ...: drift in the machine's load hits every variant alike.

    An exception of an in-process ``measure`` is recorded as that round's failure; the others go on."""
    runs: dict[str, list[Result]] = {name: [] for name in names}
    for round_no in range(rounds):
        for name in names:
            try:
                result = measure(name, round_no)
            except Exception as error:  # one failed measurement must not end the benchmark
                result = {"error": f"{type(error).__name__}: {error}"}
            runs[name].append(result)
            line = f"FAILED: {result['error']}" if "error" in result else (describe or _describe)(result)
            print(f"round {round_no + 1}/{rounds} {name}: {line}", file=sys.stderr, flush=True)
    return runs


def _describe(result: Result) -> str:
    return ", ".join(f"{k} {v:.4g}" for k, v in result.items() if isinstance(v, float)) or "done"


def medians(results: Sequence[Result], keys: Sequence[str]) -> Result | None:
    """Median of each key over the successful results that have it (None when every result failed)."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return None
    values = {k: [r[k] for r in ok if r.get(k) is not None] for k in keys}
    return {k: statistics.median(v) for k, v in values.items() if v}


def failure_notes(runs: Mapping[str, Sequence[Result]]) -> list[str]:
    """One line per name with some (not all) failed rounds: the medians exclude them."""
    notes = []
    for name, results in runs.items():
        failed = [r for r in results if "error" in r]
        if failed and len(failed) < len(results):
            notes.append(f"{name}: {len(failed)}/{len(results)} rounds failed ({failed[0]['error']}); "
                         "medians over the others")
    return notes


# --- peak memory and timing ---------------------------------------------------------------------------------------
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


def machine() -> str:
    """What a table was measured on: speeds compare only within one machine (bf16 on a CPU without avx512_bf16/AMX
    is emulated, ~10x slower), so every benchmark prints this line with its table."""
    import os

    import torch

    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    return (f"CPU capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} cores, "
            f"{torch.get_num_threads()} torch threads, torch {torch.__version__}, CUDA: {cuda}")


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


# --- output -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Column:
    """A table column: its title, how to read its value from a row (a key or a function; None: no value, shown
    as ``-``), the format of numbers (e.g. ``.2f``), and whether it still shows when the row failed (``key``)."""

    title: str
    value: str | Callable[[Result], Any]
    fmt: str = ""
    numeric: bool = True
    key: bool = False

    def text(self, row: Result) -> str:
        value = row.get(self.value) if isinstance(self.value, str) else self.value(row)
        if value is None:
            return "-"
        return value if isinstance(value, str) else format(value, self.fmt)


def table(columns: Sequence[Column], rows: Sequence[Result]) -> str:
    """The markdown table of ``rows``. A row with ``error`` (or ``skipped``: a reason it was not run) shows its key
    columns, then ``failed: reason`` (the reason) in the first other column and ``-`` in the rest."""
    cells = []
    for row in rows:
        if "error" not in row and "skipped" not in row:
            cells.append([c.text(row) for c in columns])
            continue
        note = f"failed: {row['error']}" if "error" in row else row["skipped"]
        first = next(i for i, c in enumerate(columns) if not c.key)
        cells.append([c.text(row) if c.key else note if i == first else "-" for i, c in enumerate(columns)])
    return markdown_table([c.title for c in columns], cells, numeric=[c.numeric for c in columns])


def ratio(value: float | None, base: float | None) -> str | None:
    """``value / base`` as ``1.23x`` (None, shown as ``-``, when either is missing)."""
    return f"{value / base:.2f}x" if value is not None and base else None


def write_json(path: str | None, blob: Mapping[str, Any]) -> None:
    """Every raw result, for reruns of the analysis without rerunning the benchmark."""
    if path:
        Path(path).write_text(json.dumps(blob, indent=2, default=str) + "\n")
        print(f"\nraw results: {path}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--child"] or len(sys.argv) != 6:
        raise SystemExit(f"usage: {sys.argv[0]} --child FILE FUNCTION PAYLOAD_JSON RESULT_FILE (used by run_child)")
    _child_main(*sys.argv[2:])
