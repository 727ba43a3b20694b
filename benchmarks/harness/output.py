"""What a benchmark prints and writes: the command line, the machine it measured on, the markdown table, the JSON
file of raw results."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from gte_pro.utils.tables import markdown_table
from harness.children import Result

BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # CPU flags of bf16 in hardware; without them bf16 is emulated


def command_line() -> str:
    """This process's command, as a shell would take it."""
    return shlex.join([sys.executable, *sys.argv])


def announce() -> str:
    """Print ``$ <command line>`` (first, so that a log says what it is of) and return the command line."""
    command = command_line()
    print(f"$ {command}", flush=True)
    return command


def cpu_model() -> tuple[str, set[str]]:
    """(the CPU's model name, its flags) from /proc/cpuinfo (("unknown CPU", {}) where there is none)."""
    model, flags = "unknown CPU", set()
    cpuinfo = Path("/proc/cpuinfo")
    for line in cpuinfo.read_text().splitlines() if cpuinfo.is_file() else []:
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown CPU":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, flags


def machine() -> str:
    """What a table was measured on, and when: speeds compare only within one machine (bf16 on a CPU without
    avx512_bf16/AMX is emulated, ~10x slower), so every benchmark prints this line with its table."""
    import torch

    model, flags = cpu_model()
    bf16 = ", ".join(f for f in BF16_FLAGS if f in flags) or "none"
    cuda = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (f"{model}, CPU capability {torch.backends.cpu.get_cpu_capability()} (bf16 in hardware: {bf16}), "
            f"{os.cpu_count()} cores, {torch.get_num_threads()} torch threads, torch {torch.__version__}, "
            f"CUDA: {cuda}; {date}")


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


def save(args: argparse.Namespace, default: str | None = None, **parts: Any) -> None:
    """``--json`` (or ``default``): ``{"settings": the options, **parts}``."""
    write_json(getattr(args, "json", None) or default, {"settings": vars(args), **parts})
