"""Training records: reading (query, positive[, negatives]) files, validating them, cleaning the texts.

Every error names the file, the line and the field, so that a user can fix a 10 GB file without bisecting it.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import logging
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gte_pro.data.scores import ScoredFile, parse_scores
from gte_pro.errors import CHECK_PATH, DataError

log = logging.getLogger(__name__)

# texts are cut here before cleaning and tokenizing: far beyond 8,192 tokens of any real text, while a 10 MB line
# (a base64 blob, a concatenated dump) would otherwise cost ~30 s of tokenizing for 256 kept tokens
MAX_TEXT_CHARS = 100_000
CUT = f"text cut at {MAX_TEXT_CHARS:,} chars"
CONTROL = "text with control or invalid characters removed"


@dataclass
class Example:
    query: str
    positives: list[str]
    negatives: list[str] = field(default_factory=list)
    # teacher scores (FlagEmbedding's pos_scores / neg_scores): one per positive / negative, in order; None: none
    pos_scores: list[float] | None = None
    neg_scores: list[float] | None = None


@dataclass
class CleaningReport:
    """How many rows were read, kept and dropped, and why; and what cleaning changed or removed inside kept rows
    (``cleaned``: cut or repaired texts, short or duplicate negatives and positives), so no input vanishes
    uncounted."""

    source: str
    read: int = 0
    kept: int = 0
    dropped: Counter = field(default_factory=Counter)
    cleaned: Counter = field(default_factory=Counter)

    def summary(self) -> str:
        reasons = ", ".join(f"{reason}: {n}" for reason, n in self.dropped.most_common()) or "none"
        text = f"{self.source}: read {self.read} rows, kept {self.kept}, dropped {self.read - self.kept} ({reasons})"
        if self.cleaned:
            text += "; cleaned: " + ", ".join(f"{what}: {n}" for what, n in self.cleaned.most_common())
        return text

    @classmethod
    def from_dict(cls, blob: dict[str, Any]) -> CleaningReport:
        # caches built before ``cleaned`` existed have no such key
        return cls(blob["source"], blob["read"], blob["kept"], Counter(blob["dropped"]),
                   Counter(blob.get("cleaned", {})))

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "read": self.read, "kept": self.kept, "dropped": dict(self.dropped),
                "cleaned": dict(self.cleaned)}


_WHITESPACE = re.compile(r"\s+")


def clean_text(text: str) -> str:
    """Drop control and format characters, collapse every run of whitespace to one space, strip."""
    text = "".join(ch if ch.isspace() or unicodedata.category(ch)[0] != "C" else " " for ch in text)
    return _WHITESPACE.sub(" ", text).strip()


def _clean_counted(text: str, report: CleaningReport) -> str:
    """``clean_text`` of at most MAX_TEXT_CHARS characters; a cut or a removed character is counted."""
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS]
        report.cleaned[CUT] += 1
    cleaned = clean_text(text)
    if cleaned != _WHITESPACE.sub(" ", text).strip():  # something other than whitespace was removed
        report.cleaned[CONTROL] += 1
    return cleaned


def _kept(keep: list[bool], texts: list[str], scores: list[float] | None) -> tuple[list[str], list[float] | None]:
    """The texts (and their teacher scores, which travel with them) where ``keep`` is true."""
    kept = [t for t, k in zip(texts, keep, strict=True) if k]
    return kept, None if scores is None else [s for s, k in zip(scores, keep, strict=True) if k]


def _long_enough(texts: list[str], scores: list[float] | None, min_chars: int, report: CleaningReport,
                 what: str) -> tuple[list[str], list[float] | None]:
    kept, scores = _kept([len(t) >= min_chars for t in texts], texts, scores)
    if len(kept) < len(texts):
        report.cleaned[f"{what} shorter than {min_chars} chars removed"] += len(texts) - len(kept)
    return kept, scores


def iter_clean_examples(examples: Iterable[Example], report: CleaningReport, min_query_chars: int = 3,
                        min_doc_chars: int = 10) -> Iterator[Example]:
    """Clean texts, drop rows that cannot train anything (counting each reason in ``report``), one row at a time.

    Duplicates are found by an 8-byte digest of (query, first positive), not the texts: the memory this takes is
    ~100 bytes per row, whatever the texts' length. A text that cleaning removes (too short, a negative equal to a
    positive) takes its teacher score with it; the scores of the texts kept stay paired with them, in order.
    """
    seen: set[int] = set()
    for example in examples:
        report.read += 1
        query = _clean_counted(example.query, report)
        if len(query) < min_query_chars:
            report.dropped[f"query shorter than {min_query_chars} chars"] += 1
            continue
        positives = [_clean_counted(p, report) for p in example.positives]
        if not any(len(p) >= min_doc_chars for p in positives):
            report.dropped[f"no positive of {min_doc_chars}+ chars"] += 1
            continue
        positives, pos_scores = _long_enough(positives, example.pos_scores, min_doc_chars, report, "positive")
        key = int.from_bytes(hashlib.blake2b(f"{query}\0{positives[0]}".encode(), digest_size=8).digest(), "big")
        if key in seen:
            report.dropped["duplicate (query, positive)"] += 1
            continue
        seen.add(key)
        negatives, neg_scores = _long_enough([_clean_counted(n, report) for n in example.negatives],
                                             example.neg_scores, min_doc_chars, report, "negative")
        distinct, neg_scores = _kept([n not in positives for n in negatives], negatives, neg_scores)
        if len(distinct) < len(negatives):
            report.cleaned["negative equal to a positive removed"] += len(negatives) - len(distinct)
        report.kept += 1
        yield Example(query, positives, distinct, pos_scores, neg_scores)


def clean_examples(
    examples: Iterable[Example], source: str, min_query_chars: int = 3, min_doc_chars: int = 10
) -> tuple[list[Example], CleaningReport]:
    """Clean texts, drop rows that cannot train anything, and count each reason."""
    report = CleaningReport(source)
    kept = list(iter_clean_examples(examples, report, min_query_chars, min_doc_chars))
    return kept, report


# --- reading and validating --------------------------------------------------------------------------------------
def type_name(value: Any) -> str:
    """The name a user knows from the file: ``null`` rather than ``NoneType``."""
    return "null" if value is None else type(value).__name__


def _as_text_list(value: Any, where: str, name: str) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        bad = next((i for i, v in enumerate(value) if not isinstance(v, str)), None)
        if bad is None:
            return list(value)
        raise DataError(f"{where}: field '{name}' must be a string or a list of strings; item {bad} is "
                        f"{type_name(value[bad])}")
    raise DataError(f"{where}: field '{name}' must be a string or a list of strings, got {type_name(value)}")


def _one_of(record: Mapping[str, Any], keys: tuple[str, ...], where: str, label: Any) -> str | None:
    """The one key of ``keys`` present in ``record`` (None if none is); two of them is ambiguous."""
    present = [k for k in keys if k in record]
    if len(present) > 1:
        raise DataError(f"{where}: fields {' and '.join(repr(label(k)) for k in present)} both present; "
                        f"keep one")
    return present[0] if present else None


def parse_record(record: Any, where: str, labels: Mapping[str, str] | None = None) -> Example:
    """One JSON object in our layout {query, positive, negatives} or FlagEmbedding's {query, pos, neg}, with
    optional teacher scores {pos_scores, neg_scores} (``gte_pro.data.scores``).

    ``labels`` names the fields in errors as the user knows them (a dataset's column names)."""
    def label(key: str) -> str:
        return (labels or {}).get(key, key)

    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type_name(record)}")
    if "query" not in record:
        raise DataError(f"{where}: missing field 'query' (expected {{query, positive[, negatives]}} "
                        f"or {{query, pos, neg}})")
    if not isinstance(record["query"], str):
        raise DataError(f"{where}: field '{label('query')}' must be a string, got {type_name(record['query'])}")
    positive_key = _one_of(record, ("positive", "pos"), where, label)
    if positive_key is None:
        raise DataError(f"{where}: missing field 'positive' (or 'pos' in FlagEmbedding layout)")
    positives = _as_text_list(record[positive_key], where, label(positive_key))
    if not positives:
        raise DataError(f"{where}: field '{label(positive_key)}' is empty")
    negative_key = _one_of(record, ("negatives", "neg", "negative"), where, label)
    negatives = _as_text_list(record[negative_key], where, label(negative_key)) if negative_key else []
    pos_scores, neg_scores = parse_scores(record, positives, negatives, where,
                                          (label(positive_key), label(negative_key or "neg")), label)
    return Example(record["query"], positives, negatives, pos_scores, neg_scores)


def iter_text_lines(path: str | Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of each line of a UTF-8 text file (a BOM is skipped, CRLF is fine); bytes that are not
    UTF-8 raise DataError naming the line instead of a UnicodeDecodeError from deep inside a loop."""
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a folder, expected a file", hint=CHECK_PATH)
    if not path.is_file():
        raise DataError(f"{path}: file not found", hint=CHECK_PATH)
    with path.open("rb") as handle:
        for line_no, raw in enumerate(handle, start=1):
            if line_no == 1 and raw.startswith(codecs.BOM_UTF8):
                raw = raw[len(codecs.BOM_UTF8):]
            try:
                yield line_no, raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}, line {line_no}: not UTF-8 text (byte 0x{raw[err.start]:02x} at byte "
                                f"{err.start + 1} of the line); save the file as UTF-8") from None


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """json's object hook: a key given twice would silently keep the last value."""
    record = dict(pairs)
    if len(record) < len(pairs):
        raise _DuplicateKey(next(key for key, n in Counter(k for k, _ in pairs).items() if n > 1))
    return record


def _loads(line: str, where: str) -> Any:
    try:
        return json.loads(line, object_pairs_hook=_unique_keys)
    except _DuplicateKey as err:
        raise DataError(f"{where}: field '{err}' appears twice in the object") from None
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: invalid JSON ({err.msg.removesuffix(' at')} at column {err.colno})") from None
    except RecursionError:
        raise DataError(f"{where}: invalid JSON (nested too deeply)") from None
    except ValueError as err:  # e.g. an integer of more than 4,300 digits
        raise DataError(f"{where}: invalid JSON ({err})") from None


def iter_jsonl(path: str | Path) -> Iterator[tuple[int, Any]]:
    """(line number, parsed object) for each non-blank line; bad JSON raises DataError naming the line, and so
    does a file without a single JSON line."""
    empty = True
    for line_no, line in iter_text_lines(path):
        if line.strip():
            empty = False
            yield line_no, _loads(line, f"{path}, line {line_no}")
    if empty:
        raise DataError(f"{path}: no JSON lines (the file is empty or blank)")


def iter_pairs_jsonl(path: str | Path) -> Iterator[Example]:
    """The records of a JSON-lines training file, validated, one at a time (the file is never held in memory)."""
    scored = ScoredFile()
    for line_no, obj in iter_jsonl(path):
        example = parse_record(obj, f"{path}, line {line_no}")
        scored.check(example.pos_scores is not None, f"{path}, line {line_no}")
        yield example


def clean_required(rows: Iterable[Example], report: CleaningReport, what: str, min_query_chars: int = 3,
                   min_doc_chars: int = 10) -> Iterator[Example]:
    """``iter_clean_examples``, and a DataError naming ``what`` and the drop reasons if no row is left (a validation
    file whose every row is dropped must not become an empty validation set)."""
    empty = True
    for row in iter_clean_examples(rows, report, min_query_chars, min_doc_chars):
        empty = False
        yield row
    if empty:
        raise DataError(f"{report.source}: no rows left after cleaning ({what}; {report.summary()})")
