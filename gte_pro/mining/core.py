"""Hard-negative mining: for each query, corpus entries that score high but are not its positives.

Semantics (``MiningOptions``): the corpus is ranked by cosine score for each query, best first, equal scores by
ascending corpus id; the query's positives (and texts identical to them, which the caller maps to the same id) are
taken out; the window ``[range_min, range_max)`` of what remains is the candidate pool. Candidates that score too
close to the query's positive (``relative_margin``, ``absolute_margin``) or too high (``max_score``) are dropped
as likely false negatives, and ``num_negatives`` of the survivors are kept: the best ones (``sampling=top``,
NV-Retriever's TopK-PercPos with ``relative_margin``) or a uniform draw (``sampling=random``).

Exactness. A float32 matrix product gives an entry a value that depends on the shape of the whole product (the
BLAS kernel picks its blocking by shape), so a corpus split over 2 ranks would score a pair differently from 1
process and a near-tie could flip. Candidates are therefore *found* with chunked float32 products (plus spare ones
for near-ties, as in evaluation) and *scored* per pair (``pair_scores``: one sum over one vector pair, whatever the
batch), so every score, ordering and margin decision is a pure function of the two embeddings: 1 or N processes,
chunked or not, give the same result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist

from gte_pro.mining.options import MiningOptions
from gte_pro.retrieval import gather_columns, order_candidates, top_candidates
from gte_pro.utils.distributed import is_distributed, world

_TIE_SPARE = 16  # extra candidates per rank, so that near-ties at the window's edge are scored exactly


@dataclass
class MinedNegatives:
    indices: torch.Tensor  # (Q, num_negatives) long: global corpus ids, best first; -1 pads short rows
    scores: torch.Tensor  # (Q, num_negatives) float32 cosine scores; nan where indices == -1
    positive_scores: torch.Tensor  # (Q,) the lowest score among the query's positives; nan: none given
    dropped_false_negatives: int  # window candidates removed by the margins / max_score
    short_rows: int  # queries left with fewer than num_negatives
    # candidates the rank windows held (the corpus minus positives, up to range_max a query; with a teacher, the
    # candidates it judged): what the drops are a share of; -1: not counted (a window kept by an older version)
    window_candidates: int = -1


# --- scores --------------------------------------------------------------------------------------------------------
_PAIR_BLOCK = 1 << 20  # products per block of pair scoring: cache-sized blocks are ~5x faster than large ones


def unit_rows(x: torch.Tensor, in_place: bool = False) -> torch.Tensor:
    """Rows scaled to length 1, float32; each row's norm is a sum over that row alone (the same in any batch).
    A block of rows at a time, into ``x`` itself with ``in_place`` (a float32 ``x``): no full-size temporary."""
    x = x.float()
    out = x if in_place else torch.empty_like(x)
    step = max(1, (1 << 22) // max(x.shape[-1], 1))
    for start in range(0, x.shape[0], step):
        part = x[start : start + step]
        torch.mul(part, (part * part).sum(-1, keepdim=True).sqrt().clamp_min(1e-12).reciprocal(),
                  out=out[start : start + step])
    return out


def pair_scores(q: torch.Tensor, c: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                budget: int = _PAIR_BLOCK) -> torch.Tensor:
    """Cosine of unit rows q[rows[i]] and c[cols[i, j]] (rows: (R,), cols: (R, K)) as one float32 sum per pair:
    unlike a matrix product's entries, the value does not depend on which other pairs are scored with it."""
    out = torch.empty(cols.shape, dtype=torch.float32, device=q.device)
    step = max(1, min(budget, _PAIR_BLOCK) // max(cols.shape[1] * q.shape[1], 1))
    for start in range(0, cols.shape[0], step):
        r, k = rows[start : start + step], cols[start : start + step]
        out[start : start + step] = (q[r][:, None, :] * c[k]).sum(-1)
    return out


def _positive_scores(q: torch.Tensor, c: torch.Tensor, local_of: torch.Tensor, pairs: torch.Tensor,
                     budget: int) -> torch.Tensor:
    """(Q,) the lowest score among each query's positives (nan: none). Each rank scores the positives in its shard;
    an all_reduce(MIN) combines them (exact: the min of the same float32 values in any order)."""
    best = torch.full((q.shape[0],), math.inf, device=q.device)
    local = local_of[pairs[1]] >= 0
    rows, cols = pairs[0][local], local_of[pairs[1][local]]
    if rows.numel():
        best = best.scatter_reduce(0, rows, pair_scores(q, c, rows, cols[:, None], budget)[:, 0], reduce="amin")
    if is_distributed():
        dist.all_reduce(best, op=dist.ReduceOp.MIN)
    return torch.where(torch.isinf(best), torch.full_like(best, math.nan), best)


def _local_candidates(q: torch.Tensor, c: torch.Tensor, corpus_index: torch.Tensor, num_corpus: int, width: int,
                      budget: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(exact scores, global ids), each (Q, width), of this shard's best entries per query: found by chunked matrix
    products, then scored per pair. Padded with -inf and id ``num_corpus`` (past every real id) where the shard is
    smaller, so that every rank sends the same shape."""
    values = torch.full((q.shape[0], width), -math.inf, device=q.device)
    ids = torch.full((q.shape[0], width), num_corpus, dtype=torch.long, device=q.device)
    local = min(width, c.shape[0])
    if local:
        _, found = top_candidates(q, c, local, budget)
        values[:, :local] = pair_scores(q, c, torch.arange(q.shape[0], device=q.device), found, budget)
        ids[:, :local] = corpus_index.to(q.device)[found]
    return values, ids


# --- selection -----------------------------------------------------------------------------------------------------
def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 on int64 tensors (wrapping arithmetic; shifts masked to be logical): a counter-based random
    number, the same on every device and in every process."""
    x = x + (0x9E3779B97F4A7C15 - (1 << 64))
    x = (x ^ ((x >> 30) & ((1 << 34) - 1))) * (0xBF58476D1CE4E5B9 - (1 << 64))
    x = (x ^ ((x >> 27) & ((1 << 37) - 1))) * (0x94D049BB133111EB - (1 << 64))
    return x ^ ((x >> 31) & ((1 << 33) - 1))


def _positive_mask(ids: torch.Tensor, first_row: int, pairs: torch.Tensor, num_corpus: int) -> torch.Tensor:
    """(R, W) whether ids[r, j] is a positive of query first_row + r (sorted (query, id) keys + searchsorted)."""
    lo, hi = torch.searchsorted(pairs[0], torch.tensor([first_row, first_row + ids.shape[0]], device=pairs.device))
    stride = num_corpus + 1
    keys = ((pairs[0][lo:hi] - first_row) * stride + pairs[1][lo:hi]).sort().values.to(ids.device)
    if keys.numel() == 0:
        return torch.zeros_like(ids, dtype=torch.bool)
    wanted = torch.arange(ids.shape[0], device=ids.device)[:, None] * stride + ids
    return keys[torch.searchsorted(keys, wanted).clamp(max=keys.numel() - 1)] == wanted


def _too_close(scores: torch.Tensor, positive: torch.Tensor, options: MiningOptions) -> torch.Tensor:
    """Candidates to drop as likely false negatives (a nan positive score drops nothing by a margin)."""
    drop = torch.zeros_like(scores, dtype=torch.bool)
    pos = positive[:, None]
    if options.relative_margin is not None:
        # |pos| rather than (1 - m) * pos: for a negative positive score the latter would raise the bar
        drop |= scores > pos - pos.abs() * options.relative_margin
    if options.absolute_margin is not None:
        drop |= scores > pos - options.absolute_margin
    if options.max_score is not None:
        drop |= scores > options.max_score
    return drop


def pick_survivors(survivor: torch.Tensor, order: torch.Tensor, draw_keys: torch.Tensor, options: MiningOptions,
                   first_row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(columns chosen, whether each is a survivor): up to ``num_negatives`` survivors per query, the first by
    ``order`` (sampling=top), or a uniform draw (sampling=random: the smallest keys of (seed, query, ``draw_keys``),
    the same in every process)."""
    if options.sampling == "random":
        queries = torch.arange(first_row, first_row + survivor.shape[0], device=survivor.device)[:, None]
        key = _mix(_mix(_mix(torch.full_like(queries, options.seed)) + queries) + draw_keys)
    else:
        key = order
    key = torch.where(survivor, key, torch.iinfo(torch.long).max)
    chosen = torch.sort(key, dim=1, stable=True).indices[:, : min(options.num_negatives, survivor.shape[1])]
    return chosen, survivor.gather(1, chosen)


def _select(ids: torch.Tensor, scores: torch.Tensor, positive: torch.Tensor, is_positive: torch.Tensor,
            first_row: int, options: MiningOptions, num_corpus: int
            ) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """From candidates ordered best first: (indices, scores) of the kept negatives, how many were dropped, and how
    many candidates the window held."""
    candidate = (ids < num_corpus) & ~is_positive
    rank = candidate.long().cumsum(1) - 1
    window = candidate & (rank >= options.range_min) & (rank < options.range_max)
    drop = window & _too_close(scores, positive, options)
    survivor = window & ~drop
    columns = torch.arange(ids.shape[1], device=ids.device).expand_as(ids)
    chosen, kept = pick_survivors(survivor, columns, rank, options, first_row)
    take = chosen.shape[1]
    # best first: kept ones in column (= score) order, then the padding
    chosen = chosen.gather(1, torch.sort(torch.where(kept, chosen, chosen + ids.shape[1]), dim=1).indices)
    kept = survivor.gather(1, chosen)
    out_ids = torch.full((ids.shape[0], options.num_negatives), -1, dtype=torch.long, device=ids.device)
    out_scores = torch.full(out_ids.shape, math.nan, device=ids.device)
    out_ids[:, :take] = torch.where(kept, ids.gather(1, chosen), -1)
    out_scores[:, :take] = torch.where(kept, scores.gather(1, chosen), math.nan)
    return out_ids, out_scores, int(drop.sum()), int(window.sum())


def _merged(values: torch.Tensor, ids: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Every rank's candidates side by side -> (ids, scores) of the best ``width``, equal scores by lower id."""
    values, ids = gather_columns(values), gather_columns(ids)
    ordered = order_candidates(values, ids, width)
    by_id = ids.sort(dim=1)  # ids are distinct per row (shards do not overlap), padding sorts last
    found = torch.searchsorted(by_id.values, ordered)
    return ordered, values.gather(1, by_id.indices).gather(1, found)


# --- the entry point -----------------------------------------------------------------------------------------------
def _check_inputs(query_emb: torch.Tensor, corpus_emb: torch.Tensor, corpus_index: torch.Tensor, num_corpus: int,
                  positives: Sequence[Sequence[int]]) -> None:
    if num_corpus < 1:
        raise ValueError("mine_negatives: the corpus is empty: there is nothing to mine negatives from")
    if query_emb.ndim != 2 or corpus_emb.ndim != 2 or query_emb.shape[1] != corpus_emb.shape[1]:
        raise ValueError(f"mine_negatives: query embeddings {tuple(query_emb.shape)} and corpus embeddings "
                         f"{tuple(corpus_emb.shape)} do not match: expected (queries, d) and (documents, d)")
    if corpus_index.shape != (corpus_emb.shape[0],):
        raise ValueError(f"mine_negatives: corpus_index {tuple(corpus_index.shape)} must hold one global id per "
                         f"corpus row ({corpus_emb.shape[0]})")
    if len(positives) != query_emb.shape[0]:
        raise ValueError(f"mine_negatives: {len(positives)} positive lists for {query_emb.shape[0]} queries")


def _positive_pairs(positives: Sequence[Sequence[int]], num_corpus: int, device: torch.device) -> torch.Tensor:
    """(2, P) distinct (query, corpus id) positive pairs, sorted by query."""
    pairs = [(q, int(p)) for q, ids in enumerate(positives) for p in sorted(set(ids))]
    bad = next(((q, p) for q, p in pairs if not 0 <= p < num_corpus), None)
    if bad:
        raise ValueError(f"mine_negatives: positive id {bad[1]} of query {bad[0]} is not a corpus id "
                         f"(0..{num_corpus - 1})")
    return torch.tensor(pairs, dtype=torch.long, device=device).reshape(-1, 2).T.contiguous()


def mine_negatives(query_emb: torch.Tensor, corpus_emb: torch.Tensor, corpus_index: torch.Tensor, num_corpus: int,
                   positives: Sequence[Sequence[int]], options: MiningOptions,
                   overwrite_corpus: bool = False) -> MinedNegatives:
    """Mine negatives for every query (see the module doc). ``query_emb`` (Q, d): all queries, the same on every
    rank; ``corpus_emb`` (n_local, d): this rank's shard, whose global ids are ``corpus_index``; ``positives[q]``:
    corpus ids never returned for query q. Collective under torch.distributed: every rank calls it and gets the
    same result. Memory: the score blocks stay under ``options.max_scores_per_chunk`` entries, plus Q x
    (range_max + most positives of a query + 16) candidates per rank; ``overwrite_corpus``: ``corpus_emb`` (float32,
    on the queries' device) is scaled in place instead of copied."""
    _check_inputs(query_emb, corpus_emb, corpus_index, num_corpus, positives)
    if query_emb.shape[0] == 0:  # the same on every rank (all queries are everywhere): no collective to skip
        empty = torch.empty(0, options.num_negatives)
        return MinedNegatives(empty.long(), empty, torch.empty(0), 0, 0, 0)
    device, budget = query_emb.device, options.max_scores_per_chunk
    pairs = _positive_pairs(positives, num_corpus, device)
    most_positives = int(torch.bincount(pairs[0]).max()) if pairs.numel() else 0
    width = min(options.range_max + most_positives, num_corpus)
    columns = min(width + _TIE_SPARE, num_corpus)  # the same on every rank: the gathered shapes must agree
    with torch.no_grad(), torch.autocast(device.type, enabled=False):  # scores in float32, never in bf16/fp16
        q, c = unit_rows(query_emb), unit_rows(corpus_emb.to(device), in_place=overwrite_corpus)
        local_of = torch.full((num_corpus,), -1, dtype=torch.long, device=device)
        local_of[corpus_index.to(device)] = torch.arange(c.shape[0], device=device)
        positive_scores = _positive_scores(q, c, local_of, pairs, budget)
        values, ids = _local_candidates(q, c, corpus_index, num_corpus, columns, budget)
        del local_of
        out_ids, out_scores, dropped, candidates = [], [], 0, 0
        step = max(1, budget // (world()[1] * columns))
        for start in range(0, q.shape[0], step):
            merged_ids, merged_scores = _merged(values[start : start + step], ids[start : start + step], width)
            is_positive = _positive_mask(merged_ids, start, pairs, num_corpus)
            chosen, scores, n, held = _select(merged_ids, merged_scores, positive_scores[start : start + step],
                                              is_positive, start, options, num_corpus)
            out_ids.append(chosen)
            out_scores.append(scores)
            dropped += n
            candidates += held
    indices, scores = torch.cat(out_ids), torch.cat(out_scores)
    return MinedNegatives(indices, scores, positive_scores, dropped, int((indices < 0).any(1).sum()), candidates)
