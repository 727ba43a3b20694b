"""Markdown tables, the one format of every table we print or write (sweep summaries, metrics, benchmarks)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def cell(value: Any, digits: int = 4) -> str:
    """Floats with ``digits`` decimals, None as an empty cell, ``|`` escaped so it cannot split a row."""
    if value is None:
        return ""
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return text.replace("|", "\\|")


def markdown_table(columns: Sequence[str], rows: Iterable[Sequence[Any]], numeric: Sequence[bool] | None = None,
                   digits: int = 4) -> str:
    """One header row, an alignment row (``---:`` for numeric columns), one line per row; ends with a newline."""
    numeric = numeric or [False] * len(columns)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---:" if n else "---" for n in numeric) + "|"]
    lines += ["| " + " | ".join(cell(value, digits) for value in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
