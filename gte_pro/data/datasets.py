"""Datasets: training rows read from the token cache (with the per-epoch draw of positives and negatives), the
cache's rows as Examples for inspection, and the texts of a retrieval set for evaluation."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any, NamedTuple

from torch.utils.data import Dataset
from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import TokenizedCache
from gte_pro.data.records import Example
from gte_pro.evaluation.metrics import RetrievalSet


class DrawnRow(NamedTuple):
    """One training row as drawn for a step: token ids of the query, one positive and the negatives."""

    query: list[int]
    positive: list[int]
    negatives: list[list[int]]
    row: int  # the row of the training data (batches carry it, so that a failing step can name its rows)


class TokenizedPairs(Dataset):
    """Rows of the token cache -> (query ids, positive ids, k negatives' ids), drawn afresh each epoch.

    Items are fetched by ``(row, epoch)`` keys (``gte_pro.data.sampling.EpochSampler``; a plain row means epoch 0).
    The draw of a row's positive and negatives is a pure function of (seed, row, epoch): every epoch draws anew,
    in one process or in DataLoader workers alike, and a resumed run draws exactly what an uninterrupted one would.
    Missing hard negatives are filled with other rows' positives. ``__getitems__`` lets the DataLoader fetch a
    whole batch in one read of the memory-mapped table.
    """

    def __init__(self, rows: Any, num_negatives: int, seed: int) -> None:
        self.rows = rows  # a datasets.Dataset with the TOKEN_COLUMNS, memory-mapped
        self.num_negatives = num_negatives
        self.seed = seed

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, key: int | tuple[int, int]) -> DrawnRow:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> list[DrawnRow]:
        pairs = [(key, 0) if isinstance(key, int) else (int(key[0]), int(key[1])) for key in keys]
        fetched = self.rows[[row for row, _ in pairs]]
        items = []
        for query, positives, pool, (row, epoch) in zip(fetched["query"], fetched["positives"], fetched["negatives"],
                                                        pairs, strict=True):
            rng = random.Random((self.seed * 1_000_003 + row) * 7_919 + epoch)
            items.append(DrawnRow(query, rng.choice(positives), self._negatives(pool, row, rng), row))
        return items

    def _negatives(self, pool: list[list[int]], index: int, rng: random.Random) -> list[list[int]]:
        if len(pool) >= self.num_negatives:
            return rng.sample(pool, self.num_negatives)
        negatives = list(pool)
        while len(negatives) < self.num_negatives:  # too few hard negatives: other rows' positives
            other = rng.randrange(len(self.rows))
            if other != index:
                negatives.append(rng.choice(self.rows[other]["positives"]))
        return negatives


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


def token_lengths(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None,
                  chunk: int = 8192) -> list[int]:
    """Tokens per text after truncation: the length a batch is padded to. Chunked: only the counts are kept."""
    lengths: list[int] = []
    for start in range(0, len(texts), chunk):
        ids = tokenizer(list(texts[start : start + chunk]), truncation=max_length is not None,
                        max_length=max_length)["input_ids"]
        lengths += [len(row) for row in ids]
    return lengths


class EvalTexts(Dataset):
    """Queries and corpus of a RetrievalSet as one list, longest first (less padding per batch).

    With the tokenizer, length is the token count after truncation (what a batch is padded to: on the demo corpus
    ~0.94 of the padded positions are real tokens, ~0.74 when sorting by characters); without, the characters.
    Each item carries a signed id: query i -> i, corpus entry j -> -(j + 1).
    """

    def __init__(self, retrieval: RetrievalSet, query_prefix: str = "", doc_prefix: str = "",
                 tokenizer: PreTrainedTokenizerBase | None = None, max_length: int | None = None) -> None:
        items = [(i, query_prefix + q) for i, q in enumerate(retrieval.queries)]
        items += [(-(j + 1), doc_prefix + d) for j, d in enumerate(retrieval.corpus)]
        texts = [text for _, text in items]
        lengths = token_lengths(tokenizer, texts, max_length) if tokenizer is not None else [0] * len(items)
        order = sorted(range(len(items)), key=lambda i: (lengths[i], len(texts[i])), reverse=True)
        self.items = [items[i] for i in order]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, str]:
        return self.items[index]
