"""Retrieval evaluation: score the ranking of a corpus for each query (``gte_pro.retrieval`` ranks it).

The metric definitions follow sentence-transformers' ``InformationRetrievalEvaluator`` exactly (binary
relevance, ties broken by ascending corpus index), so numbers are comparable with the peers' (a test checks it).

Under DDP each rank embeds a share of the texts; ``evaluate_distributed`` gathers the (small) query matrix, ranks
each rank's corpus shard locally and merges the per-rank top-k lists, so the corpus embeddings never travel.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from gte_pro.evaluation.quantize import int8_ranges, quantize
from gte_pro.retrieval import all_gather_rows, rank_corpus, rows_where, sharded_rank

NDCG_AT = (10,)
MRR_AT = (10,)
RECALL_AT = (1, 10, 100)
MAP_AT = (100,)
TOP_K = max(*NDCG_AT, *MRR_AT, *RECALL_AT, *MAP_AT)


def owned_mask(ids: torch.Tensor, num_queries: int, num_corpus: int) -> torch.Tensor:
    """Which local entries this rank keeps: the first occurrence of each id over all ranks.

    Signed ids as in the validation batches (query i -> i, corpus entry j -> -(j + 1)). A distributed sampler pads
    the shards with repeats to equal size; only ids (8 bytes a text) are gathered to find them, never embeddings.
    Raises if some text was embedded by no rank.
    """
    slot = torch.where(ids >= 0, ids, num_queries - ids - 1)
    all_slots, offset = all_gather_rows(slot)
    total, never = num_queries + num_corpus, all_slots.shape[0]
    positions = torch.arange(never, device=slot.device)
    first = torch.full((total,), never, device=slot.device).scatter_reduce(0, all_slots, positions, reduce="amin")
    missing = int((first == never).sum())
    if missing:
        raise RuntimeError(f"evaluation embedded {total - missing} distinct texts, expected {total}")
    return first[slot] == offset + torch.arange(slot.shape[0], device=slot.device)


def evaluate_distributed(ids: torch.Tensor, embeddings: torch.Tensor, relevant: Sequence[set[int]],
                         num_corpus: int, quantization: Sequence[str] = ()) -> dict[str, float]:
    """Metrics from this rank's share of (signed id, embedding) rows; every rank returns the same numbers.

    Queries (small) are gathered to every rank; the corpus (large) stays sharded and only top-k lists travel.
    With one process this is ``evaluate_embeddings``. Each of ``quantization`` (``gte_pro.evaluation.quantize``)
    adds ``ndcg@10_<precision>``: the same retrieval over quantized embeddings.
    """
    num_queries = len(relevant)
    keep = owned_mask(ids, num_queries, num_corpus)
    ids, embeddings = ids[keep], rows_where(embeddings, keep)  # the corpus shard's embeddings are not copied
    is_query = ids >= 0
    query_ids, _ = all_gather_rows(ids[is_query])
    query_rows, _ = all_gather_rows(embeddings[is_query])
    query_emb = embeddings.new_zeros((num_queries, embeddings.shape[-1]))
    query_emb[query_ids] = query_rows
    shard, shard_index = rows_where(embeddings, ~is_query), -ids[~is_query] - 1
    metrics = retrieval_metrics(sharded_rank(query_emb, shard, shard_index, num_corpus, TOP_K).cpu(), relevant)
    for precision in quantization:
        ranges = int8_ranges(shard) if precision == "int8" else None
        ranked = sharded_rank(quantize(query_emb, precision, ranges), quantize(shard, precision, ranges),
                              shard_index, num_corpus, max(NDCG_AT), cosine=False)
        for k in NDCG_AT:
            metrics[f"ndcg@{k}_{precision}"] = retrieval_metrics(ranked.cpu(), relevant)[f"ndcg@{k}"]
    return metrics


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
    return retrieval_metrics(rank_corpus(query_emb, corpus_emb, TOP_K), relevant)
