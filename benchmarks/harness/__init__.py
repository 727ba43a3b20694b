"""What every benchmark here shares, one import (``import harness``): fresh child processes, interleaved rounds,
medians, peak memory, timing, the common options, the machine line, the markdown table and the JSON file. The
``bench_*.py`` files only say what they measure.

A measurement that must not share a process with the others (peak memory is per process; a crash, the OOM killer or
a hang must not take the other measurements with it) runs through ``run_child(function, payload, work)``: a fresh
``python harness/child.py FILE FUNCTION PAYLOAD RESULT`` imports the benchmark file, calls ``function(payload)`` and
writes its dict as JSON. A failure of any kind comes back as ``{"error": reason, "log_tail": ...}``.

- ``children``: ``run_command``, ``run_train`` (``train.py``, offline), ``run_child``, ``failure_reason``
- ``rounds``: ``interleave``, ``timed_rounds``, ``medians``, ``median_row``, ``failure_notes``
- ``timing``: ``peak_memory``, ``PeakMemory``, ``proc_kb``, ``clock``, ``timed``
- ``cli``: ``parser``, ``add_common`` (``--json``, ``--timeout``, ``--rounds``, ``--batch-size``, ...), ``int_list``
- ``output``: ``announce``, ``machine`` (CPU model, capability, cores, threads, torch, CUDA, date), ``Column``,
  ``table``, ``ratio``, ``write_json``, ``save``
- ``inputs``: ``demo_splits``, ``words``
"""

from harness.children import (
    CHILD_ENV,
    REPO,
    TRAIN_ENV,
    Result,
    failure_reason,
    run_child,
    run_command,
    run_train,
    train_command,
)
from harness.cli import CACHE_DIR, add_common, int_list, parser
from harness.inputs import demo_splits, words
from harness.output import Column, announce, command_line, cpu_model, machine, ratio, save, table, write_json
from harness.rounds import failure_notes, interleave, median_row, medians, timed_rounds
from harness.timing import MB, PeakMemory, Timing, clock, peak_memory, proc_kb, timed

__all__ = [
    "CACHE_DIR", "CHILD_ENV", "MB", "REPO", "TRAIN_ENV", "Column", "PeakMemory", "Result", "Timing", "add_common",
    "announce", "clock", "command_line", "cpu_model", "demo_splits", "failure_notes", "failure_reason", "int_list",
    "interleave", "machine", "median_row", "medians", "parser", "peak_memory", "proc_kb", "ratio", "run_child",
    "run_command", "run_train", "save", "table", "timed", "timed_rounds", "train_command", "words", "write_json",
]
