"""Collators: a list of rows -> the padded tensors of one batch (dynamic padding: each batch is padded to its own
longest text, never to ``max_length``).

Training batches hold ``query`` (B texts) and ``doc`` (the B positives, then the k negatives of each row in order,
see ``gte_pro.training.losses.split_documents``) and ``rows`` (the training rows, by index); evaluation batches hold
signed ``ids`` and ``features``. Rows with teacher scores add ``teacher_scores``: float32 (B, 1 + k), row i's
positive first, then its k negatives in the order of ``doc`` (NaN: no teacher score for that slot, or a row of a
source without scores in a mixed batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from gte_pro.data.datasets import DrawnRow
from gte_pro.errors import ConfigError


class PairCollator:
    """Tokenizes queries and documents (positives, then the negatives of each row in order) separately."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int, query_prefix: str = "",
                 doc_prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix

    def _tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt"))

    def __call__(self, rows: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
        queries = [self.query_prefix + q for q, _, _ in rows]
        docs = [self.doc_prefix + p for _, p, _ in rows]
        docs += [self.doc_prefix + n for _, _, negatives in rows for n in negatives]
        query, doc = self._tokenize(queries), self._tokenize(docs)
        real_tokens = int(query["attention_mask"].sum()) + int(doc["attention_mask"].sum())
        return {"query": query, "doc": doc, "num_negatives": len(rows[0][2]), "num_tokens": real_tokens}


class TokenCollator:
    """Pads cached token ids to each batch's longest text: the same tensors :class:`PairCollator` makes from texts.

    ``teacher_scores``: every batch carries ``teacher_scores`` (the data has scores, possibly in some sources of a
    mix only: a batch of unscored rows is then all NaN rather than without the key); otherwise a batch has them when
    one of its rows does."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, teacher_scores: bool = False) -> None:
        if tokenizer.pad_token_id is None:
            raise ConfigError(f"tokenizer {tokenizer.name_or_path} has no pad token: set tokenizer.pad_token")
        self.pad_id = tokenizer.pad_token_id
        self.left = tokenizer.padding_side == "left"
        self.token_type_ids = "token_type_ids" in tokenizer.model_input_names
        self.teacher_scores = teacher_scores

    def pad(self, rows: Sequence[Sequence[int]]) -> dict[str, torch.Tensor]:
        width = max(len(row) for row in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if self.left else slice(0, len(row))
            ids[i, span] = row
            mask[i, span] = 1
        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if self.token_type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return features

    def __call__(self, rows: list[DrawnRow]) -> dict[str, Any]:
        query = self.pad([r.query for r in rows])
        doc = self.pad([r.positive for r in rows] + [n for r in rows for n in r.negatives])
        real_tokens = int(query["attention_mask"].sum()) + int(doc["attention_mask"].sum())
        batch = {"query": query, "doc": doc, "num_negatives": len(rows[0].negatives), "num_tokens": real_tokens,
                 "rows": torch.tensor([r.row for r in rows], dtype=torch.long)}
        if self.teacher_scores or any(r.teacher is not None for r in rows):
            batch["teacher_scores"] = self.teacher_tensor(rows)
        return batch

    @staticmethod
    def teacher_tensor(rows: list[DrawnRow]) -> torch.Tensor:
        width = 1 + len(rows[0].negatives)
        return torch.tensor([r.teacher if r.teacher is not None else [float("nan")] * width for r in rows],
                            dtype=torch.float32)


class EvalCollator(TokenCollator):
    """(signed id, token ids) items (``gte_pro.data.datasets.EvalTexts``) -> ids and padded features."""

    def __call__(self, items: list[tuple[int, Sequence[int]]]) -> dict[str, Any]:  # type: ignore[override]
        return {"ids": torch.tensor([i for i, _ in items], dtype=torch.long),
                "features": self.pad([tokens for _, tokens in items])}


class GroupCollator(TokenCollator):
    """``task=rerank`` training batches: each row's query joined with its positive and then with each of its k
    negatives (``pairs``: B x (1 + k) cross-encoder inputs, row-major), by the reranker's own joining of cached
    token ids (``join``, a ``gte_pro.models.pairs.PairBatcher``)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, join: Callable[..., dict[str, torch.Tensor]],
                 teacher_scores: bool = False) -> None:
        super().__init__(tokenizer, teacher_scores)
        self.join = join

    def __call__(self, rows: list[DrawnRow]) -> dict[str, Any]:
        queries = [r.query for r in rows for _ in range(1 + len(r.negatives))]
        docs = [d for r in rows for d in (r.positive, *r.negatives)]
        pairs = self.join(queries, docs)
        batch = {"pairs": pairs, "group_size": 1 + len(rows[0].negatives),
                 "num_tokens": int(pairs["attention_mask"].sum()),
                 "rows": torch.tensor([r.row for r in rows], dtype=torch.long)}
        if self.teacher_scores or any(r.teacher is not None for r in rows):
            batch["teacher_scores"] = self.teacher_tensor(rows)
        return batch


class CandidateCollator:
    """(pair id, query ids, document ids) items (``gte_pro.data.datasets.CandidatePairs``) -> ids and joined
    features."""

    def __init__(self, join: Callable[..., dict[str, torch.Tensor]]) -> None:
        self.join = join

    def __call__(self, items: list[tuple[int, Sequence[int], Sequence[int]]]) -> dict[str, Any]:
        return {"ids": torch.tensor([i for i, _, _ in items], dtype=torch.long),
                "features": self.join([q for _, q, _ in items], [d for _, _, d in items])}
