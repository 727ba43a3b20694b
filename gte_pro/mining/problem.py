"""What ``mode=mine`` mines over: the training rows' queries, and a corpus of their positives plus any extra corpus
files (``mine.corpus_files``), de-duplicated so that a text identical to a row's positive is that positive."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gte_pro.data.records import MAX_TEXT_CHARS, DataError, Example, clean_text, iter_jsonl, type_name
from gte_pro.data.split import is_held_out


@dataclass
class MiningProblem:
    queries: list[str] = field(default_factory=list)  # distinct query texts
    corpus: list[str] = field(default_factory=list)  # distinct documents
    positives: list[list[int]] = field(default_factory=list)  # per query: corpus ids of every row's positives
    rows: list[tuple[int, list[int]]] = field(default_factory=list)  # per training row: (query, its positives)
    # validation rows split off the training source by the query hash: written back verbatim, so that training on
    # the mined file holds out the same rows (with their own negatives: validation stays comparable)
    held_out: list[Example] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # what reading the corpus files kept and dropped

    def doc_id(self, text: str, ids: dict[str, int]) -> int:
        if text not in ids:
            ids[text] = len(self.corpus)
            self.corpus.append(text)
        return ids[text]


def _text_field(record: dict, key: str, where: str, required: bool) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if key not in record:
        raise DataError(f"{where}: field '{key}' is missing (expected {{\"text\": ...}} or a BEIR corpus line "
                        "{\"_id\", \"title\", \"text\"})")
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type_name(value)}")
    return value


def read_corpus_file(path: str | Path) -> Iterator[str]:
    """The documents of a JSON-lines corpus file: {"text"} or BEIR's {"_id", "title", "text"}, joined as BEIR
    evaluation joins them (``title + " " + text``, see ``gte_pro.data.beir``). Errors name the file, line, field."""
    for line_no, record in iter_jsonl(path):
        where = f"{path}, line {line_no}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type_name(record)}")
        title = _text_field(record, "title", where, required=False)
        text = _text_field(record, "text", where, required=True)
        yield f"{title} {text}".strip() if title else text


def build_problem(rows: Iterable[Example], corpus_files: Sequence[str | Path] = (), min_doc_chars: int = 0,
                  held_out: Sequence[Example] = ()) -> MiningProblem:
    """Queries (a text repeated over rows is one query with the union of their positives) and the corpus.

    Corpus-file texts are cleaned like training texts (``clean_text``, cut at MAX_TEXT_CHARS); those shorter than
    ``min_doc_chars`` are left out (training would drop them as negatives) and counted."""
    problem, docs, queries = MiningProblem(held_out=list(held_out)), {}, {}
    for row in rows:
        query = queries.setdefault(row.query, len(queries))
        if query == len(problem.positives):
            problem.queries.append(row.query)
            problem.positives.append([])
        ids = [problem.doc_id(text, docs) for text in row.positives]
        known = problem.positives[query]
        known += [i for i in dict.fromkeys(ids) if i not in known]
        problem.rows.append((query, ids))
    if not problem.rows:
        raise DataError("mode=mine: the data module gave no training rows to mine negatives for")
    problem.counts["corpus from training positives"] = len(problem.corpus)
    for path in corpus_files:
        for raw in read_corpus_file(path):
            text = clean_text(raw[:MAX_TEXT_CHARS])
            if len(text) < max(min_doc_chars, 1):
                problem.counts[f"corpus-file texts shorter than {max(min_doc_chars, 1)} chars left out"] += 1
                continue
            before = len(problem.corpus)
            problem.doc_id(text, docs)
            problem.counts["corpus-file texts added" if len(problem.corpus) > before else
                           "corpus-file texts already in the corpus"] += 1
    return problem


def hash_held_out_rows(source: Any) -> list[Example]:
    """The data module's validation rows if it split them off its training rows by the query hash (every one of
    them is in the hash's validation buckets), else [] (a separate validation file or split: the user passes it
    again; writing its rows into the training file would train on them)."""
    cache, fraction = getattr(source, "token_cache", None), getattr(source, "val_fraction", None)
    if cache is None or fraction is None or getattr(source, "val_file", None):
        return []
    val, _ = cache.validation()
    return val if val and all(is_held_out(ex.query, fraction) for ex in val) else []


def corpus_files_setting(value: Any) -> list[str]:
    """``mine.corpus_files`` as a list of paths (one path given as a string is a list of one)."""
    if value is None:
        return []
    paths = [value] if isinstance(value, str) else list(value) if hasattr(value, "__iter__") else None
    if paths is not None:
        if all(isinstance(p, str) and p.strip() for p in paths):
            return [str(Path(p).expanduser()) for p in paths]
    raise ValueError(f"mine.corpus_files={value!r}: expected a list of JSON-lines files, e.g. "
                     "mine.corpus_files=[data/corpus.jsonl]")
