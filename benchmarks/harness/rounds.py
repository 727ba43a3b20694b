"""Interleaved rounds (A B C, A B C, ...: drift in the machine's load hits every variant alike), and medians."""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from harness.children import Result
from harness.timing import timed


def interleave(names: Sequence[str], rounds: int, measure: Callable[[str, int], Result],
               describe: Callable[[Result], str] | None = None) -> dict[str, list[Result]]:
    """``measure(name, round)`` for A B C, A B C, ...; each name's results in round order.

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


def timed_rounds(runs: Mapping[str, Callable[[], Any]], rounds: int,
                 figures: Callable[[Any], Result] | None = None) -> tuple[dict[str, list[Result]], dict[str, Any]]:
    """In-process variants (``runs``: name -> a call that does the whole work once), interleaved and timed: (each
    round's ``seconds`` and ``cpu_s`` per name, plus ``figures(output)``; each name's last output)."""
    outputs: dict[str, Any] = {}

    def once(name: str, round_no: int) -> Result:
        with timed() as timing:
            outputs[name] = runs[name]()
        return {"seconds": timing.wall_s, "cpu_s": timing.cpu_s, **(figures(outputs[name]) if figures else {})}

    return interleave(list(runs), rounds, once, lambda r: f"{r['seconds']:.2f} s"), outputs


def medians(results: Sequence[Result], keys: Sequence[str]) -> Result | None:
    """Median of each key over the successful results that have it (None when every result failed)."""
    ok = [r for r in results if "error" not in r]
    if not ok:
        return None
    values = {k: [r[k] for r in ok if r.get(k) is not None] for k in keys}
    return {k: statistics.median(v) for k, v in values.items() if v}


def median_row(name: str, results: Sequence[Result], keys: Sequence[str], label: str = "variant") -> Result:
    """A table row: ``{label: name, **medians}``, or ``{label: name, "error": ...}`` (the first failure's reason)
    when every result failed."""
    med = medians(results, keys)
    if med is None:
        return {label: name, "error": results[0]["error"] if results else "did not run"}
    return {label: name, **med}


def failure_notes(runs: Mapping[str, Sequence[Result]]) -> list[str]:
    """One line per name with some (not all) failed rounds: the medians exclude them."""
    notes = []
    for name, results in runs.items():
        failed = [r for r in results if "error" in r]
        if failed and len(failed) < len(results):
            notes.append(f"{name}: {len(failed)}/{len(results)} rounds failed ({failed[0]['error']}); "
                         "medians over the others")
    return notes
