"""Reranker validation: each held-out query's candidate documents, reordered by the cross-encoder, scored with the
embedder's metrics (``gte_pro.evaluation.metrics.retrieval_metrics``: NDCG@10, MRR@10, Recall@1/10/100, MAP@100).

The candidates (``eval.retriever``):
- an embedder (a path or hub name, e.g. the run folder's ``model/`` of the embedder you train): its top
  ``eval.rerank_depth`` documents of the whole validation corpus, the reranker's real job in a pipeline. Embedded on
  all ranks in shares, ranked over the sharded corpus (``gte_pro.retrieval.sharded_rank``), so every rank holds the
  same lists;
- ``rows``: each held-out query's own rows' positives and negatives (a mined file's candidates), held-out split only.

Documents outside the candidates are never retrieved: Recall@100 is bounded by the retriever's recall at the depth,
and the retriever's own metrics on the same lists are logged beside the reranker's (``val/retriever/...``).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager

import torch

from gte_pro.errors import ConfigError
from gte_pro.evaluation.metrics import TOP_K
from gte_pro.mining.embed import embed_texts, embed_tokens, gather_embeddings
from gte_pro.models.encoder import Encoder
from gte_pro.retrieval import RetrievalSet, all_gather_rows, sharded_rank

log = logging.getLogger(__name__)

ROWS = "rows"


class ValidationCandidates:
    """Each validation set's candidates (per query, its corpus positions): found by the reranker's module once the
    process group exists (``RerankModule.setup``) and served by the data module as (query, candidate) pairs (its
    ``candidates``: a ``gte_pro.data.collaborators.CandidateSource``, handed in when it is built)."""

    def __init__(self) -> None:
        self.found: list[list[list[int]]] | None = None

    def candidates(self, index: int) -> list[list[int]]:
        if self.found is None:
            raise RuntimeError("the reranker's candidates are found in RerankModule.setup(), before validation")
        return self.found[index]


def retriever_candidates(retriever: Encoder, retrieval: RetrievalSet, depth: int, batch_size: int = 64,
                         autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext) -> list[list[int]]:
    """The ``depth`` best corpus entries of each query by the retriever's cosine (every rank: the same lists)."""
    queries = [retriever.query_prefix + q for q in retrieval.queries]
    query_emb, query_index = embed_texts(retriever, queries, batch_size, retriever.max_length, autocast,
                                         what="queries")
    if hasattr(retrieval.corpus, "tokens_for"):  # a BEIR corpus kept as the reranker's token ids: the retriever's
        tokens = retrieval.corpus.tokens_for(retriever.tokenizer, retriever.max_length, retriever.doc_prefix)
        shard_emb, shard_index = embed_tokens(retriever, tokens, batch_size, autocast, "documents")
    else:
        corpus = [retriever.doc_prefix + d for d in retrieval.corpus]
        shard_emb, shard_index = embed_texts(retriever, corpus, batch_size, retriever.max_length, autocast,
                                             what="documents")
    all_queries = gather_embeddings(query_emb, query_index, len(queries))
    return sharded_rank(all_queries, shard_emb, shard_index, len(retrieval.corpus), depth).cpu().tolist()


def rows_candidates(retrieval: RetrievalSet, name: str) -> list[list[int]]:
    """Each held-out query's own rows' documents (``eval.retriever=rows``)."""
    if retrieval.candidates is None:
        raise ConfigError(f"eval.retriever=rows reranks the held-out rows' own documents; the set "
                         f"{name or '(held-out)'} has no rows (a BEIR set): name an embedder, "
                         "e.g. eval.retriever=<run>/model")
    if all(len(c) == len(retrieval.relevant[q]) for q, c in enumerate(retrieval.candidates)):
        raise ConfigError("eval.retriever=rows: the held-out rows carry no negatives, so there is nothing to "
                         "rerank: name an embedder (eval.retriever=<embedder>) or use mined rows")
    return retrieval.candidates


def gather_pair_scores(ids: torch.Tensor, scores: torch.Tensor, total: int) -> torch.Tensor:
    """Every rank's (pair id, score) -> all ``total`` scores in pair order, on every rank. A distributed sampler
    pads a rank's share with repeats: a repeated pair's score is written twice, the same pair's either way."""
    all_ids, _ = all_gather_rows(ids)
    all_scores, _ = all_gather_rows(scores.float())
    out = torch.full((total,), float("nan"), device=scores.device)
    out[all_ids] = all_scores
    missing = int(out.isnan().sum())
    if missing:
        raise RuntimeError(f"reranker validation scored {total - missing} of {total} pairs: a rank's share is missing")
    return out


def reranked(candidates: Sequence[Sequence[int]], scores: torch.Tensor, top_k: int = TOP_K) -> torch.Tensor:
    """(Q, top_k) corpus indices: each query's candidates by descending score (equal scores keep the retriever's
    order), padded with -1 (never relevant) where a query has fewer candidates."""
    ranked = torch.full((len(candidates), top_k), -1, dtype=torch.long)
    start = 0
    for query, docs in enumerate(candidates):
        query_scores = scores[start : start + len(docs)].cpu()
        start += len(docs)
        order = torch.sort(-query_scores, stable=True).indices[:top_k]
        ranked[query, : len(order)] = torch.as_tensor(docs, dtype=torch.long)[order]
    return ranked


def retriever_ranking(candidates: Sequence[Sequence[int]], top_k: int = TOP_K) -> torch.Tensor:
    """The candidates in the retriever's own order, as ``reranked`` lays them out."""
    ranked = torch.full((len(candidates), top_k), -1, dtype=torch.long)
    for query, docs in enumerate(candidates):
        ranked[query, : min(len(docs), top_k)] = torch.as_tensor(list(docs)[:top_k], dtype=torch.long)
    return ranked
