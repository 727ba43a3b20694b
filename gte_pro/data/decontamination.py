"""``data.decontaminate``: the overlap of a run's training rows with its evaluation sets, reported and (``drop``)
removed, once per token cache (the matching is ``gte_pro.data.overlap_matching``).

The evaluation side is the run's validation rows (the held-out split or ``data.val_file``, as the token cache keeps
them, ``data.max_val_queries`` at most) and each ``eval.beir`` set (its split's queries with a relevant document and
those documents, read from the folder). The training rows are read back from the token cache, which keeps their
texts. The result lives in ``<cache_dir>/decontaminated/<cache>-<key>/``, the key hashing the cache, the mode, the
threshold, the permutations and the BEIR files: ``decontamination.json`` (the report) and, for ``drop``, the cache
without the overlapping rows (``train.arrow``, ``meta.json``), which the run then opens. A second run with the same
data and sets reads the report instead of scanning again, and a resumed run opens the same filtered rows.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from gte_pro.data.cache import cache_key
from gte_pro.data.collaborators import EvalSetSource
from gte_pro.data.overlap_matching import FIELDS, SHINGLES, EvalIndex, Overlap, scan
from gte_pro.utils.files import published_folder, writes_to

log = logging.getLogger(__name__)

MODES = ("report", "drop", "off")
REPORT = "decontamination.json"
VALIDATION = "held-out"  # the name the metrics table gives the run's own validation set
Side = tuple[list[tuple[str, str]], list[tuple[str, str]], dict[str, dict[str, int]]]


def evaluation_side(val: Sequence[Sequence[Any]], named: EvalSetSource | None) -> Side:
    """(queries, relevant documents) as (set name, text) pairs, and each set's counts: the validation rows', then
    those of each named set (``eval.beir``)."""
    queries = [(VALIDATION, query) for query, _, _ in val]
    docs = [(VALIDATION, doc) for _, positives, _ in val for doc in positives]
    sets = {VALIDATION: {"queries": len(queries), "documents": len(docs)}} if val else {}
    for name, set_queries, set_docs in named.texts() if named is not None else []:
        queries += [(name, text) for text in set_queries]
        docs += [(name, text) for text in set_docs]
        sets[name] = {"queries": len(set_queries), "documents": len(set_docs)}
    return queries, docs, sets


def training_rows(folder: Path) -> Iterator[tuple[int, str, list[str], list[str]]]:
    """(row, query, positives, negatives) of the token cache in ``folder``, read a record batch at a time."""
    row = 0
    with pa.memory_map(str(folder / "train.arrow")) as source:
        for batch in pa.ipc.open_stream(source):
            columns = [batch.column(name).to_pylist() for name in ("query_text", "positive_texts", "negative_texts")]
            for query, positives, negatives in zip(*columns, strict=True):
                yield row, query, positives, negatives
                row += 1


def write_kept(source_folder: Path, target: Path, dropped: set[int]) -> int:
    """Copy the token cache's rows except ``dropped`` to ``target`` (no re-tokenizing); returns the rows kept."""
    kept, row = 0, 0
    with pa.memory_map(str(source_folder / "train.arrow")) as source, writes_to(target):
        reader = pa.ipc.open_stream(source)
        with pa.ipc.new_stream(str(target), reader.schema) as writer:
            for batch in reader:
                mask = pa.array([row + i not in dropped for i in range(batch.num_rows)])
                row += batch.num_rows
                kept_batch = batch.filter(mask)
                kept += kept_batch.num_rows
                writer.write_batch(kept_batch)
    return kept


def decontaminated(cache: Path, root: Path, mode: str, threshold: float, num_perm: int,
                   named: EvalSetSource | None) -> tuple[Path, dict[str, Any] | None]:
    """(the token cache the run opens, the report) for ``data.decontaminate=mode`` (``off``: ``cache``, None); the
    result is kept in ``root/decontaminated/``."""
    if mode == "off":
        return cache, None
    key = cache_key({"cache": cache.name, "mode": mode, "threshold": threshold, "num_perm": num_perm,
                     "shingles": SHINGLES, "sets": named.signature() if named is not None else []})
    folder = root / "decontaminated" / f"{cache.name}-{key}"
    if not (folder / REPORT).is_file():
        with published_folder(folder, REPORT) as tmp:
            report = _scan(cache, tmp, mode, threshold, num_perm, named)
            (tmp / REPORT).write_text(json.dumps(report, indent=1))
    report = json.loads((folder / REPORT).read_text())
    return (folder if mode == "drop" else cache), report


def _scan(cache: Path, tmp: Path, mode: str, threshold: float, num_perm: int,
          named: EvalSetSource | None) -> dict[str, Any]:
    start = time.perf_counter()
    meta = json.loads((cache / "meta.json").read_text())
    queries, docs, sets = evaluation_side(meta["val"], named)
    overlap = scan(training_rows(cache), EvalIndex(queries, threshold, num_perm), EvalIndex(docs, threshold, num_perm),
                   sets)
    dropped = 0
    if mode == "drop":
        kept = write_kept(cache, tmp / "train.arrow", set(overlap.rows))
        dropped = meta["rows"] - kept
        (tmp / "meta.json").write_text(json.dumps({**meta, "rows": kept}))
    return as_report(overlap, meta["rows"], mode, threshold, num_perm, dropped, time.perf_counter() - start)


def as_report(overlap: Overlap, rows: int, mode: str, threshold: float, num_perm: int, dropped: int,
              seconds: float) -> dict[str, Any]:
    """What ``decontamination.json`` holds (metrics.json keeps it too, examples aside)."""
    sets = {name: {**counts, "overlap": overlap.counts.get(name, {f: {"exact": 0, "near": 0} for f in FIELDS}),
                   "examples": overlap.examples.get(name, [])} for name, counts in overlap.sets.items()}
    return {"mode": mode, "jaccard_threshold": threshold, "num_perm": num_perm, "shingles": SHINGLES,
            "training_rows": rows, "overlapping_rows": len(overlap.rows), "rows_by_field": overlap.by_field,
            "dropped_rows": dropped, "seconds": round(seconds, 3), "sets": sets}


def log_report(report: dict[str, Any]) -> None:
    """The log's decontamination section: one line per set, its examples, and what was done."""
    for name, entry in report["sets"].items():
        counts = ", ".join(f"{field} {c['exact']} exact + {c['near']} near" for field, c in entry["overlap"].items())
        log.info("decontamination: %s (%d queries, %d relevant documents): training rows repeating it: %s", name,
                 entry["queries"], entry["documents"], counts)
        for example in entry["examples"]:
            log.info("decontamination:   %s %s %s, row %d (Jaccard %.2f): %r ~ %r", name, example["field"],
                     example["kind"], example["row"], example["jaccard"], example["train"][:80],
                     example["eval"][:80])
    fields = ", ".join(f"{field}: {n}" for field, n in report["rows_by_field"].items())
    if report["mode"] == "drop":
        log.info("decontamination: dropped %d training rows (%s) of %d (Jaccard >= %g or equal after normalisation)",
                 report["dropped_rows"], fields, report["training_rows"], report["jaccard_threshold"])
    else:
        log.info("decontamination: %d of %d training rows overlap an evaluation set (%s); kept "
                 "(data.decontaminate=drop removes them)", report["overlapping_rows"], report["training_rows"],
                 fields)
