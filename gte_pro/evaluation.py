"""Retrieval evaluation: rank a corpus by cosine similarity for each query and score the ranking.

The metric definitions follow sentence-transformers' ``InformationRetrievalEvaluator`` exactly (binary
relevance, ties broken by ascending corpus index), so numbers are comparable with the peers' (a test checks it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

if TYPE_CHECKING:  # the data package imports this module
    from gte_pro.data.records import Example

NDCG_AT = (10,)
MRR_AT = (10,)
RECALL_AT = (1, 10, 100)
MAP_AT = (100,)


@dataclass
class RetrievalSet:
    """Queries, a corpus and, for each query, the set of indices of its relevant corpus entries."""

    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]

    def __post_init__(self) -> None:
        if len(self.queries) != len(self.relevant):
            raise ValueError("RetrievalSet: one relevant set per query is required")
        if not self.queries or not self.corpus:
            raise ValueError("RetrievalSet: no queries or no corpus: nothing to evaluate")

    @classmethod
    def from_examples(cls, examples: Sequence[Example], distractors: Sequence[str] = ()) -> RetrievalSet:
        """Held-out pairs -> queries, a de-duplicated corpus (positives, negatives, distractors), qrels.

        A query text that occurs several times becomes one query with the union of its positives.
        """
        corpus_index: dict[str, int] = {}
        query_index: dict[str, int] = {}
        relevant: list[set[int]] = []

        def doc_id(text: str) -> int:
            return corpus_index.setdefault(text, len(corpus_index))

        for ex in examples:
            qid = query_index.setdefault(ex.query, len(query_index))
            if qid == len(relevant):
                relevant.append(set())
            relevant[qid].update(doc_id(p) for p in ex.positives)
            for negative in ex.negatives:
                doc_id(negative)
        for text in distractors:
            doc_id(text)
        return cls(list(query_index), list(corpus_index), relevant)


def rank_corpus(query_emb: torch.Tensor, corpus_emb: torch.Tensor, top_k: int,
                max_scores_per_chunk: int = 1 << 24) -> torch.Tensor:
    """Indices (Q, k) of the top-k corpus entries by cosine similarity, best first, ties by lower index."""
    query_emb = F.normalize(query_emb.float(), dim=-1)
    corpus_emb = F.normalize(corpus_emb.float(), dim=-1)
    top_k = min(top_k, corpus_emb.shape[0])
    # a few spare candidates so that ties at the k-th score can still be ordered by index
    candidates = min(top_k + 16, corpus_emb.shape[0])
    chunk = max(1, max_scores_per_chunk // corpus_emb.shape[0])
    ranked = []
    for start in range(0, query_emb.shape[0], chunk):
        scores = query_emb[start : start + chunk] @ corpus_emb.T
        values, indices = scores.topk(candidates, dim=1)
        by_index = indices.sort(dim=1)
        values = values.gather(1, by_index.indices)
        order = torch.sort(-values, dim=1, stable=True).indices[:, :top_k]
        ranked.append(by_index.values.gather(1, order))
    return torch.cat(ranked)


def _dcg(relevances: Sequence[int], k: int) -> float:
    return sum(rel / math.log2(rank + 2) for rank, rel in enumerate(relevances[:k]))


def retrieval_metrics(ranked: torch.Tensor, relevant: Sequence[set[int]]) -> dict[str, float]:
    """NDCG@10, MRR@10, Recall@1/10/100 and MAP@100 averaged over queries (binary relevance)."""
    totals: dict[str, float] = {}
    for hits, gold in zip(ranked.tolist(), relevant, strict=True):
        is_hit = [1 if doc in gold else 0 for doc in hits]
        scores = {}
        for k in NDCG_AT:
            scores[f"ndcg@{k}"] = _dcg(is_hit, k) / _dcg([1] * len(gold), k)
        for k in MRR_AT:
            scores[f"mrr@{k}"] = next((1.0 / (r + 1) for r, h in enumerate(is_hit[:k]) if h), 0.0)
        for k in RECALL_AT:
            scores[f"recall@{k}"] = sum(is_hit[:k]) / len(gold)
        for k in MAP_AT:
            correct, precision_sum = 0, 0.0
            for r, h in enumerate(is_hit[:k]):
                if h:
                    correct += 1
                    precision_sum += correct / (r + 1)
            scores[f"map@{k}"] = precision_sum / min(k, len(gold))
        for name, value in scores.items():
            totals[name] = totals.get(name, 0.0) + value
    return {name: value / len(relevant) for name, value in totals.items()}


def evaluate_embeddings(query_emb: torch.Tensor, corpus_emb: torch.Tensor,
                        relevant: Sequence[set[int]]) -> dict[str, float]:
    top_k = max(*NDCG_AT, *MRR_AT, *RECALL_AT, *MAP_AT)
    return retrieval_metrics(rank_corpus(query_emb, corpus_emb, top_k), relevant)
