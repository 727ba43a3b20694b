"""Datasets: training rows read from the token cache (with the per-epoch draw of positives and negatives), the
cache's rows as Examples for inspection, and the texts of a retrieval set for evaluation."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import TokenizedCache
from gte_pro.data.collaborators import NegativePool
from gte_pro.data.records import Example
from gte_pro.errors import ConfigError
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)


class DrawnRow(NamedTuple):
    """One training row as drawn for a step: token ids of the query, one positive and the negatives."""

    query: list[int]
    positive: list[int]
    negatives: list[list[int]]
    row: int  # the row of the training data (batches carry it, so that a failing step can name its rows)
    # teacher scores of [positive, *negatives] (NaN: a slot with no teacher score); None: the rows have no scores
    teacher: list[float] | None = None


def draw_indices(seed: int, row: int, epoch: int, num_positives: int, pool_size: int, num_negatives: int,
                 num_rows: int, positive_count: Callable[[int], int]) -> tuple[int, list[int | None],
                                                                                list[tuple[int, int]]]:
    """What row ``row`` draws in ``epoch``, as indices: its positive's, its negatives' in the pool of ``pool_size``
    (None: a missing hard negative, filled with another row's positive), and those fills as (other row, index of its
    positive). A pure function of (seed, row, epoch), so that the memory plan (``gte_pro.preflight.batch_lengths``)
    draws the lengths a run will train on without reading the token ids. Indices rather than texts: the same draws
    as ``rng.choice(texts)``, and the teacher score of each."""
    rng = random.Random((seed * 1_000_003 + row) * 7_919 + epoch)
    positive = rng.choice(range(num_positives))
    if pool_size >= num_negatives:
        return positive, list(rng.sample(range(pool_size), num_negatives)), []
    picked: list[int | None] = list(range(pool_size))
    fills: list[tuple[int, int]] = []
    while len(picked) < num_negatives:  # too few hard negatives: other rows' positives
        other = rng.randrange(num_rows)
        if other != row:
            fills.append((other, rng.choice(range(positive_count(other)))))
            picked.append(None)
    return positive, picked, fills


class TokenizedPairs(Dataset):
    """Rows of the token cache -> (query ids, positive ids, k negatives' ids), drawn afresh each epoch.

    Items are fetched by ``(row, epoch)`` keys (``gte_pro.data.sampling.EpochSampler``; a plain row means epoch 0).
    The draw of a row's positive and negatives is a pure function of (seed, row, epoch): every epoch draws anew,
    in one process or in DataLoader workers alike, and a resumed run draws exactly what an uninterrupted one would.
    Missing hard negatives are filled with other rows' positives. ``__getitems__`` lets the DataLoader fetch a
    whole batch in one read of the memory-mapped table. With ``mined`` (re-mining during training), a row's hard
    negatives come from the pool active in the item's epoch instead of the row's own.

    Rows with teacher scores (``pos_scores``/``neg_scores`` columns) draw the scores of the texts drawn; a slot
    that has no teacher score (a missing hard negative filled with another row's positive, a re-mined negative) is
    NaN, which the distillation losses leave out. Indices are drawn, not texts, so the draw is the same as without
    scores.
    """

    def __init__(self, rows: Any, num_negatives: int, seed: int, mined: NegativePool | None = None) -> None:
        self.rows = rows  # a datasets.Dataset with the TOKEN_COLUMNS, memory-mapped
        self.num_negatives = num_negatives
        self.seed = seed
        self.mined = mined

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: int | tuple[int, int]) -> DrawnRow:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> list[DrawnRow]:
        pairs = [(key, 0) if isinstance(key, int) else (int(key[0]), int(key[1])) for key in keys]
        fetched = self.rows[[row for row, _ in pairs]]
        own = fetched["negatives"]
        pos_scores, neg_scores = fetched.get("pos_scores"), fetched.get("neg_scores")
        mined = self._mined_negatives(pairs) if self.mined is not None and self.num_negatives else None
        items = []
        for i, (query, positives, (row, epoch)) in enumerate(zip(fetched["query"], fetched["positives"], pairs,
                                                                 strict=True)):
            is_own = mined is None or mined[i] is None
            pool = own[i] if is_own else mined[i]
            positive, picked, fills = draw_indices(self.seed, row, epoch, len(positives), len(pool),
                                                   self.num_negatives, len(self.rows), self._positive_count)
            negatives = [pool[j] for j in picked if j is not None]
            negatives += [self.rows[other]["positives"][j] for other, j in fills]
            teacher = None
            if pos_scores is not None and pos_scores[i] is not None:
                scores = neg_scores[i] if is_own else []  # re-mined negatives have no teacher score
                teacher = [pos_scores[i][positive]] + [math.nan if j is None or not scores else scores[j]
                                                       for j in picked]
            items.append(DrawnRow(query, positives[positive], negatives, row, teacher))
        return items

    def _mined_negatives(self, pairs: list[tuple[int, int]]) -> list[list[list[int]] | None]:
        """Token ids of each item's negatives in the pool active for its epoch (None: no pool yet)."""
        assert self.mined is not None
        references: list[list[tuple[int, int]] | None] = [None] * len(pairs)
        for epoch in {epoch for _, epoch in pairs}:
            at = [i for i, (_, e) in enumerate(pairs) if e == epoch]
            found = self.mined.references([pairs[i][0] for i in at], epoch)
            for i, refs in zip(at, found or [None] * len(at), strict=True):
                references[i] = refs
        wanted = sorted({r for refs in references if refs for r, _ in refs})
        if not wanted:
            return references  # type: ignore[return-value]  # all None, or rows with no mined negatives
        positives = dict(zip(wanted, self.rows[wanted]["positives"], strict=True))  # one read for the whole batch
        return [None if refs is None else [positives[r][j] for r, j in refs] for refs in references]

    def _positive_count(self, row: int) -> int:
        return len(self.rows[row]["positives"])


class ExampleView(Sequence[Example]):
    """The cached training rows as Examples, read on access (for inspection; training reads the token ids)."""

    def __init__(self, cache: TokenizedCache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.cache.example(i) for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self.cache.example(index % len(self))

    def __iter__(self) -> Iterator[Example]:
        return (self.cache.example(i) for i in range(len(self)))


class TokenizedTexts:
    """Texts tokenized once (truncated at ``max_length``, special tokens added) and kept as one flat int32 array
    with offsets: ~4 bytes a token instead of Python lists, and no text is tokenized again for its batch.
    ``lengths``: tokens per text; ``chars``: characters per text (the tie-break of the longest-first order)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None,
                 chunk: int = 8192) -> None:
        parts, lengths = [], []
        for start in range(0, len(texts), chunk):
            ids = tokenizer(list(texts[start : start + chunk]), truncation=max_length is not None,
                            max_length=max_length)["input_ids"]
            lengths += [len(row) for row in ids]
            parts += [np.asarray(row, dtype=np.int32) for row in ids]
        self.lengths = np.asarray(lengths, dtype=np.int64)
        self.chars = np.asarray([len(text) for text in texts], dtype=np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(self.lengths)]).astype(np.int64)
        self.tokens = np.concatenate(parts) if parts else np.empty(0, dtype=np.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> np.ndarray:
        return self.tokens[self.offsets[index] : self.offsets[index + 1]]


def longest_first(lengths: np.ndarray, chars: np.ndarray) -> np.ndarray:
    """Indices by token count, then characters, longest first; equal keys keep their input order."""
    return np.lexsort((np.arange(len(lengths)), -np.asarray(chars), -np.asarray(lengths)))


def corpus_tokens(corpus: Sequence[str], tokenizer: PreTrainedTokenizerBase, max_length: int | None,
                  doc_prefix: str) -> Any:
    """The token ids of a retrieval set's documents: tokenized now, or a store's (``corpus.store``, see
    ``gte_pro.data.corpus_store``), which must have been built with the same ``max_length`` and prefix."""
    store = getattr(corpus, "store", None)
    if store is None:
        return TokenizedTexts(tokenizer, [doc_prefix + text for text in corpus], max_length)
    if (store.meta["max_length"], store.meta["doc_prefix"]) != (max_length, doc_prefix):
        raise ConfigError(f"{store.folder}: tokenized with max_length={store.meta['max_length']}, doc prefix "
                         f"{store.meta['doc_prefix']!r}; this evaluation uses {max_length}, {doc_prefix!r}")
    return store


class EvalTexts(Dataset):
    """Queries and corpus of a RetrievalSet, tokenized once, queries then documents, each longest first (less
    padding per batch: on the demo corpus ~0.94 of the padded positions are real tokens, ~0.74 when sorting by
    characters).

    Items are (signed id, token ids): query i -> i, corpus entry j -> -(j + 1). A data module builds one per set
    and reuses it for every validation, so the texts are tokenized once per run, not once per validation. A stored
    corpus (``load_beir_stored``) is read from disk a document at a time.
    """

    def __init__(self, retrieval: RetrievalSet, tokenizer: PreTrainedTokenizerBase, max_length: int | None,
                 query_prefix: str = "", doc_prefix: str = "") -> None:
        self.queries = TokenizedTexts(tokenizer, [query_prefix + q for q in retrieval.queries], max_length)
        self.docs = corpus_tokens(retrieval.corpus, tokenizer, max_length, doc_prefix)
        # queries, then documents, each longest first: a rank's rows hold its queries and then its corpus shard,
        # which evaluation can then take as one slice instead of copying the shard's embeddings
        self.order = np.concatenate([longest_first(self.queries.lengths, self.queries.chars),
                                     len(self.queries) + longest_first(self.docs.lengths, self.docs.chars)])

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray]:
        row = int(self.order[index])
        if row < len(self.queries):
            return row, self.queries[row]
        return -(row - len(self.queries) + 1), self.docs[row - len(self.queries)]


class EvalTextsCache:
    """One :class:`EvalTexts` per (set, max_length, prefixes), built on first use: a run validates before, during
    and after training with the same texts."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, int | None, str, str], tuple[RetrievalSet, EvalTexts]] = {}

    def get(self, tokenizer: PreTrainedTokenizerBase, retrieval: RetrievalSet, max_length: int | None,
            query_prefix: str = "", doc_prefix: str = "") -> EvalTexts:
        key = (id(retrieval), max_length, query_prefix, doc_prefix)
        if key not in self._built:  # the set is kept with it, so that its id cannot be reused by another object
            self._built[key] = (retrieval, EvalTexts(retrieval, tokenizer, max_length, query_prefix, doc_prefix))
        return self._built[key][1]


class CandidatePairs(Dataset):
    """``task=rerank`` validation: each query of a retrieval set with each of its candidate documents, as
    (pair id, query ids, document ids). The pair id is the pair's place in the flattened candidate lists (query 0's
    candidates first), which the reranker's validation scatters its scores back to; items are served longest pair
    first, so that each batch pads little."""

    def __init__(self, texts: EvalTexts, candidates: Sequence[Sequence[int]]) -> None:
        self.texts = texts
        self.query_of = np.repeat(np.arange(len(candidates)), [len(c) for c in candidates])
        self.doc_of = np.asarray([j for c in candidates for j in c], dtype=np.int64)
        lengths = texts.queries.lengths[self.query_of] + np.asarray(texts.docs.lengths)[self.doc_of]
        self.order = np.lexsort((np.arange(len(lengths)), -lengths))

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, index: int) -> tuple[int, np.ndarray, np.ndarray]:
        pair = int(self.order[index])
        return pair, self.texts.queries[int(self.query_of[pair])], self.texts.docs[int(self.doc_of[pair])]
