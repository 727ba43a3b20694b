"""What ``mode=mine`` mines over: the training rows' queries, and a corpus of their positives plus any extra corpus
files (``mine.corpus_files``, through a store on disk: ``gte_pro.mining.corpus``), de-duplicated so that a text
identical to a row's positive is that positive."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from gte_pro.data.datasets import TokenizedTexts
from gte_pro.data.records import Example
from gte_pro.data.split import is_held_out
from gte_pro.errors import ConfigError, DataError
from gte_pro.mining.corpus import TextStore


class JoinedTokens:
    """Token ids of the mining corpus, ids in corpus order: the positives (tokenized now), then the store's lines
    ``rows``. ``lengths`` and ``chars`` as ``TokenizedTexts`` (what the longest-first batching sorts by)."""

    def __init__(self, head: TokenizedTexts, store: TextStore, rows: np.ndarray) -> None:
        self.head, self.store, self.rows = head, store, rows
        self.lengths = np.concatenate([head.lengths, store.lengths[rows]])
        self.chars = np.concatenate([head.chars, store.chars[rows]])

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        if index < len(self.head):
            return self.head[index]
        return self.store[int(self.rows[index - len(self.head)])]


class MiningCorpus(Sequence):
    """The documents mined over, by corpus id: ``texts`` (held: the training positives), then the lines ``rows``
    of a ``TextStore`` (read from disk when asked for)."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.store: TextStore | None = None
        self.rows = np.empty(0, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.texts) + len(self.rows)

    def __getitem__(self, index: Any) -> str:
        if not isinstance(index, (int, np.integer)):
            raise TypeError(f"MiningCorpus indices are integers, got {type(index).__name__}")
        index = int(index) + len(self) if index < 0 else int(index)
        if not 0 <= index < len(self):
            raise IndexError(f"corpus id {index} out of range (0..{len(self) - 1})")
        if index < len(self.texts):
            return self.texts[index]
        assert self.store is not None
        return self.store.text(int(self.rows[index - len(self.texts)]))

    def attach(self, store: TextStore, min_doc_chars: int, counts: Counter) -> None:
        """Add the store's distinct texts that are long enough and not one of ``texts``; count what each line of
        the files became, as if read one by one (a short text is left out, a repeat is already in the corpus)."""
        shortest = max(min_doc_chars, 1)
        long_enough = store.chars[store.distinct] - len(store.meta["doc_prefix"]) >= shortest
        known = np.zeros(len(store.distinct), dtype=bool)
        known[np.searchsorted(store.distinct, np.fromiter(store.lines_of(self.texts), dtype=np.int64))] = True
        added = long_enough & ~known
        self.store, self.rows = store, store.distinct[added]
        if (~long_enough).any():
            counts[f"corpus-file texts shorter than {shortest} chars left out"] += int(
                store.occurrences[~long_enough].sum())
        if added.any():
            counts["corpus-file texts added"] += int(added.sum())
        repeats = int(store.occurrences[long_enough].sum()) - int(added.sum())
        if repeats:
            counts["corpus-file texts already in the corpus"] += repeats

    def tokens(self, tokenizer: PreTrainedTokenizerBase, max_length: int, doc_prefix: str) -> Any:
        """Token ids of every document with ``doc_prefix``, truncated at ``max_length``: ``TokenizedTexts`` of
        the held texts, joined with the store's when there is one (built with the same settings)."""
        head = TokenizedTexts(tokenizer, [doc_prefix + text for text in self.texts], max_length)
        if self.store is None:
            return head
        settings = (self.store.meta["max_length"], self.store.meta["doc_prefix"])
        if settings != (max_length, doc_prefix):
            raise ConfigError(f"{self.store.folder}: tokenized with max_length={settings[0]}, doc prefix "
                             f"{settings[1]!r}; this mining uses {max_length}, {doc_prefix!r}")
        return JoinedTokens(head, self.store, self.rows)


@dataclass
class MiningProblem:
    queries: list[str] = field(default_factory=list)  # distinct query texts
    corpus: MiningCorpus = field(default_factory=MiningCorpus)  # distinct documents: positives, then the files'
    positives: list[list[int]] = field(default_factory=list)  # per query: corpus ids of every row's positives
    rows: list[tuple[int, list[int]]] = field(default_factory=list)  # per training row: (query, its positives)
    # validation rows split off the training source by the query hash: written back verbatim, so that training on
    # the mined file holds out the same rows (with their own negatives: validation stays comparable)
    held_out: list[Example] = field(default_factory=list)
    counts: Counter = field(default_factory=Counter)  # what reading the corpus files kept and dropped

    def doc_id(self, text: str, ids: dict[str, int]) -> int:
        if text not in ids:
            ids[text] = len(self.corpus.texts)
            self.corpus.texts.append(text)
        return ids[text]


def build_problem(rows: Iterable[Example], store: TextStore | None = None, min_doc_chars: int = 0,
                  held_out: Sequence[Example] = ()) -> MiningProblem:
    """Queries (a text repeated over rows is one query with the union of their positives) and the corpus: the
    positives, then the distinct texts of ``store`` (the corpus files) that are not one of them.

    Corpus-file texts were cleaned like training texts (``clean_text``, cut at MAX_TEXT_CHARS); those shorter than
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
    if store is not None:
        problem.corpus.attach(store, min_doc_chars, problem.counts)
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
    raise ConfigError(f"mine.corpus_files={value!r}: expected a list of JSON-lines files, e.g. "
                     "mine.corpus_files=[data/corpus.jsonl]")
