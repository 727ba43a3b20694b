"""Exact nearest-neighbour retrieval, the ground floor that data, evaluation and mining share.

- ``RetrievalSet``: queries, a corpus and each query's relevant entries (what a held-out split or a BEIR set is).
- Exact top-k by cosine similarity (``rank_corpus``), in query chunks to bound memory, ties by ascending corpus
  index (``top_candidates`` + ``order_candidates``, spare candidates ``TIE_SPARE``).
- Under DDP: ``all_gather_rows`` and ``gather_columns`` move rows / candidate columns between ranks, and
  ``sharded_rank`` ranks a corpus split across ranks by merging each rank's top-k lists (the corpus embeddings never
  travel).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist
import torch.nn.functional as F

from gte_pro.utils.distributed import world

if TYPE_CHECKING:  # types only: the data package builds retrieval sets from its examples
    from gte_pro.data.records import Example

TIE_SPARE = 16  # extra candidates so that ties at the k-th score can be ordered by index


@dataclass
class RetrievalSet:
    """Queries, a corpus and, for each query, the set of indices of its relevant corpus entries."""

    queries: list[str]
    corpus: list[str]
    relevant: list[set[int]]
    # each query's own rows' documents (positives, then negatives, first occurrence first), for held-out rows:
    # what a reranker reorders with eval.retriever=rows; None for sets without rows (BEIR)
    candidates: list[list[int]] | None = None

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
        candidates: list[dict[int, None]] = []  # insertion-ordered sets

        def doc_id(text: str) -> int:
            return corpus_index.setdefault(text, len(corpus_index))

        for ex in examples:
            qid = query_index.setdefault(ex.query, len(query_index))
            if qid == len(relevant):
                relevant.append(set())
                candidates.append({})
            relevant[qid].update(doc_id(p) for p in ex.positives)
            candidates[qid].update(dict.fromkeys(doc_id(text) for text in (*ex.positives, *ex.negatives)))
        for text in distractors:
            doc_id(text)
        return cls(list(query_index), list(corpus_index), relevant, [list(c) for c in candidates])


def top_candidates(query_emb: torch.Tensor, corpus_emb: torch.Tensor, k: int, max_scores_per_chunk: int,
                    tie_break: torch.Tensor | None = None,
                    column_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scores, indices), each (Q, k), of the k best corpus rows per query; queries in chunks to bound memory.

    ``column_scale`` (one per corpus row) multiplies each corpus row's scores: 1 / its norm gives cosines without a
    normalised copy of the corpus. ``tie_break`` (float64, one per corpus row, in [0, 1)): for integer scores
    (quantized embeddings, where ties are common): each score becomes ``score + tie_break``, exact in float64, so
    equal scores are ordered by it."""
    chunk = max(1, max_scores_per_chunk // max(corpus_emb.shape[0], 1))
    values, indices = [], []
    for start in range(0, query_emb.shape[0], chunk):
        scores = query_emb[start : start + chunk] @ corpus_emb.T
        if column_scale is not None:
            scores *= column_scale
        if tie_break is not None:
            scores = scores + tie_break
        v, i = scores.topk(k, dim=1)
        values.append(v)
        indices.append(i)
    return torch.cat(values), torch.cat(indices)


def cosine_inputs(query_emb: torch.Tensor, corpus_emb: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Unit queries, the corpus as it is and 1 / each corpus row's norm (as F.normalize, at least 1e-12): the
    corpus, the large side, is never copied."""
    corpus_emb = corpus_emb.float()
    return F.normalize(query_emb.float(), dim=-1), corpus_emb, 1 / corpus_emb.norm(dim=-1).clamp(min=1e-12)


def rows_where(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``x[mask]``, as a view (no copy) when the selected rows are one contiguous run, as they are for a rank's
    queries and its corpus shard (``EvalTexts`` orders queries before documents)."""
    selected = mask.nonzero().flatten()
    if len(selected) == 0 or int(selected[-1] - selected[0]) + 1 == len(selected):
        start = int(selected[0]) if len(selected) else 0
        return x[start : start + len(selected)]
    return x[mask]


def order_candidates(values: torch.Tensor, indices: torch.Tensor, top_k: int) -> torch.Tensor:
    """The top_k candidate indices per row, best score first, equal scores by ascending corpus index."""
    by_index = indices.sort(dim=1)
    values = values.gather(1, by_index.indices)
    order = torch.sort(-values, dim=1, stable=True).indices[:, :top_k]
    return by_index.values.gather(1, order)


def rank_corpus(query_emb: torch.Tensor, corpus_emb: torch.Tensor, top_k: int,
                max_scores_per_chunk: int = 1 << 24) -> torch.Tensor:
    """Indices (Q, k) of the top-k corpus entries by cosine similarity, best first, ties by lower index."""
    query_emb, corpus_emb, scale = cosine_inputs(query_emb, corpus_emb)
    top_k = min(top_k, corpus_emb.shape[0])
    # a few spare candidates so that ties at the k-th score can still be ordered by index
    candidates = min(top_k + TIE_SPARE, corpus_emb.shape[0])
    values, indices = top_candidates(query_emb, corpus_emb, candidates, max_scores_per_chunk, column_scale=scale)
    return order_candidates(values, indices, top_k)


# --- sharded retrieval: each rank holds a share of the texts' embeddings -------------------------------------------
def all_gather_rows(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Every rank's rows of ``x`` concatenated in rank order (counts may differ per rank), and this rank's offset."""
    rank, size = world()
    if size == 1:
        return x, 0
    count = torch.tensor([x.shape[0]], device=x.device)
    counts = [torch.zeros_like(count) for _ in range(size)]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    # all_gather needs equal shapes: pad to the largest share (at least one row: empty tensors trip some backends)
    padded = x.new_zeros((max(max(sizes), 1), *x.shape[1:]))
    padded[: x.shape[0]] = x
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded)
    return torch.cat([part[:n] for part, n in zip(parts, sizes, strict=True)]), sum(sizes[:rank])


def gather_columns(x: torch.Tensor) -> torch.Tensor:
    """(Q, w) on every rank -> (Q, world * w): the candidates of all ranks side by side."""
    if world()[1] == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(world()[1])]
    dist.all_gather(parts, x.contiguous())
    return torch.cat(parts, dim=1)


def sharded_rank(query_emb: torch.Tensor, shard_emb: torch.Tensor, shard_index: torch.Tensor, num_corpus: int,
                 top_k: int, max_scores_per_chunk: int = 1 << 24, cosine: bool = True) -> torch.Tensor:
    """``rank_corpus`` over a corpus split across ranks: every rank ranks its own shard, then the per-rank top-k
    lists (scores + global indices, Q x k each) are gathered and merged. Needs all queries on every rank.

    ``shard_index`` holds the global corpus index of each row of ``shard_emb``; shards must not overlap.
    ``cosine`` false: rank by the inner product of integer-valued vectors as given (quantized embeddings), in
    float64 with ties broken by index exactly, however many there are.
    """
    tie_break = scale = None
    if cosine:
        query_emb, shard_emb, scale = cosine_inputs(query_emb, shard_emb)
    else:
        query_emb, shard_emb = query_emb.double(), shard_emb.double()
        # the lower global index wins a tie; integer scores stay exact below 2**53
        tie_break = (num_corpus - shard_index.to(shard_emb.device).double()) / (num_corpus + 1)
    top_k = min(top_k, num_corpus)
    width = min(top_k + TIE_SPARE, num_corpus)
    local = min(width, shard_emb.shape[0])
    # padding: score -inf and index num_corpus (past every real one) sort after every real candidate
    values = query_emb.new_full((query_emb.shape[0], width), float("-inf"))
    indices = torch.full_like(values, num_corpus, dtype=torch.long)
    if local:
        v, i = top_candidates(query_emb, shard_emb, local, max_scores_per_chunk, tie_break, scale)
        values[:, :local], indices[:, :local] = v, shard_index.to(i.device)[i]
    return order_candidates(gather_columns(values), gather_columns(indices), top_k)
