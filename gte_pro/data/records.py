"""Training records: reading (query, positive[, negatives]) files, validating them, cleaning the texts.

Every error names the file, the line and the field, so that a user can fix a 10 GB file without bisecting it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class DataError(ValueError):
    """Bad training or evaluation data; the message names the file, line and field."""


@dataclass
class Example:
    query: str
    positives: list[str]
    negatives: list[str] = field(default_factory=list)


@dataclass
class CleaningReport:
    """How many rows were read, kept and dropped, and why."""

    source: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in self.dropped.most_common()) or "none"
        return f"{self.source}: read {self.read} rows, kept {self.kept}, dropped {self.read - self.kept} ({reasons})"

    @classmethod
    def from_dict(cls, blob: dict[str, Any]) -> CleaningReport:
        return cls(blob["source"], blob["read"], blob["kept"], Counter(blob["dropped"]))

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "read": self.read, "kept": self.kept, "dropped": dict(self.dropped)}


_WHITESPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Drop control and format characters, collapse every run of whitespace to one space, strip."""
    text = "".join(ch if ch.isspace() or unicodedata.category(ch)[0] != "C" else " " for ch in text)
    return _WHITESPACE.sub(" ", text).strip()


def iter_clean_examples(examples: Iterable[Example], report: CleaningReport, min_query_chars: int = 3,
                        min_doc_chars: int = 10) -> Iterator[Example]:
    """Clean texts, drop rows that cannot train anything (counting each reason in ``report``), one row at a time.

    Duplicates are found by an 8-byte digest of (query, first positive), not the texts: the memory this takes is
    ~100 bytes per row, whatever the texts' length.
    """
    seen: set[int] = set()
    for example in examples:
        report.read += 1
        query = clean_text(example.query)
        if len(query) < min_query_chars:
            report.dropped[f"query shorter than {min_query_chars} chars"] += 1
            continue
        positives = [p for p in (clean_text(p) for p in example.positives) if len(p) >= min_doc_chars]
        if not positives:
            report.dropped[f"no positive of {min_doc_chars}+ chars"] += 1
            continue
        key = int.from_bytes(hashlib.blake2b(f"{query}\0{positives[0]}".encode(), digest_size=8).digest(), "big")
        if key in seen:
            report.dropped["duplicate (query, positive)"] += 1
            continue
        seen.add(key)
        negatives = [n for n in (clean_text(n) for n in example.negatives) if len(n) >= min_doc_chars]
        report.kept += 1
        yield Example(query, positives, [n for n in negatives if n not in positives])


def clean_examples(
    examples: Iterable[Example], source: str, min_query_chars: int = 3, min_doc_chars: int = 10
) -> tuple[list[Example], CleaningReport]:
    """Clean texts, drop rows that cannot train anything, and count each reason."""
    report = CleaningReport(source)
    kept = list(iter_clean_examples(examples, report, min_query_chars, min_doc_chars))
    return kept, report


def _as_text_list(value: Any, where: str, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise DataError(f"{where}: field '{name}' must be a string or a list of strings, got {type(value).__name__}")


def parse_record(record: Any, where: str) -> Example:
    """One JSON object in our layout {query, positive, negatives} or FlagEmbedding's {query, pos, neg}."""
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    if "query" not in record:
        raise DataError(f"{where}: missing field 'query' (expected {{query, positive[, negatives]}} "
                        f"or {{query, pos, neg}})")
    if not isinstance(record["query"], str):
        raise DataError(f"{where}: field 'query' must be a string, got {type(record['query']).__name__}")
    positive_key = next((k for k in ("positive", "pos") if k in record), None)
    if positive_key is None:
        raise DataError(f"{where}: missing field 'positive' (or 'pos' in FlagEmbedding layout)")
    positives = _as_text_list(record[positive_key], where, positive_key)
    if not positives:
        raise DataError(f"{where}: field '{positive_key}' is empty")
    negative_key = next((k for k in ("negatives", "neg", "negative") if k in record), None)
    negatives = _as_text_list(record[negative_key], where, negative_key) if negative_key else []
    return Example(record["query"], positives, negatives)


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line; bad JSON raises DataError naming the line."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    with path.open(encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield line_no, json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}, line {line_no}: invalid JSON ({err.msg} at column {err.colno})") from None


def iter_pairs_jsonl(path: str | Path) -> Iterator[Example]:
    """The records of a JSON-lines training file, validated, one at a time (the file is never held in memory)."""
    for line_no, obj in iter_jsonl(path):
        yield parse_record(obj, f"{path}, line {line_no}")
