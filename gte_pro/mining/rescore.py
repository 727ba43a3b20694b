"""Rescoring the mining window with a teacher: ``mode=mine mine.rescore_with=<teacher>``.

The embedder proposes, the teacher judges. The embedder ranks the corpus as without a teacher and hands over each
query's whole window [range_min, range_max) (no margin applied to its cosine scores: ``window_options``). The teacher
(``gte_pro.models.teacher``: a cross-encoder's logit, or an embedder's similarity) scores every (query, candidate)
pair and every (query, positive) pair. Then, on the teacher's scores:

- a candidate the teacher scores at or above the query's positive is dropped, always; with several positives the
  lowest positive score is the bar (it drops more than the highest would: the safe side against false negatives);
- the margins drop more, on the teacher's scale: ``absolute_margin`` (above pos - m), ``max_score`` (above it),
  ``relative_margin`` (above pos - |pos| x m: for an embedder teacher only; a cross-encoder's logits have no zero
  point, so the run refuses it: ``gte_pro.mining.options.teacher_margin_problems``). A query without a positive
  (none survived cleaning) drops nothing;
- ``num_negatives`` survivors are kept: ``sampling=top`` the highest teacher scores (the hardest by the better
  judge; equal scores by embedder rank), ``sampling=random`` a uniform draw (keys of (seed, query, embedder rank));
  kept negatives are written best first by teacher score, with the teacher's scores as ``neg_scores`` and those of
  the row's positives as ``pos_scores`` (FlagEmbedding's layout: ``loss=distill_kl`` trains on the file).

Sharding (``gte_pro.scoring.pair_scoring``). A cross-encoder's pairs are sorted by characters and cut into batches of
``rescore_batch_size`` that the ranks share; an embedder teacher embeds each distinct query and document once, in
batches the ranks share the same way; an ensemble does both for each member and averages the standardised scores.
The scores are gathered to every rank. A batch is made from the texts alone, so every float32 score, and with it
the mined file, does not depend on the world size. The teacher runs in float32 (its weights' dtype), outside
the trainer's autocast.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from gte_pro.mining.core import MinedNegatives, _too_close, pick_survivors
from gte_pro.mining.options import MiningOptions
from gte_pro.mining.problem import MiningCorpus
from gte_pro.models.teacher import Teacher
from gte_pro.scoring.judge import groups_from_window
from gte_pro.scoring.pair_scoring import teacher_scores


def window_options(options: MiningOptions) -> MiningOptions:
    """What the embedder mines for the teacher: every candidate of the window, best first, no margin."""
    return replace(options, num_negatives=options.range_max - options.range_min, sampling="top",
                   relative_margin=None, absolute_margin=None, max_score=None)


@dataclass
class Rescored:
    teacher: str
    kind: str
    positive_scores: list[list[float]]  # per query: the teacher's score of each of its positives (problem order)
    held_out_scores: list[tuple[list[float], list[float]]]  # per held-out row: (pos_scores, neg_scores)
    judged_per_query: torch.Tensor  # (Q,) window candidates the teacher scored
    dropped_per_query: torch.Tensor  # (Q,) of those, dropped (at or above the positive, or by a margin)
    pairs: int  # pairs scored in all: positives, window candidates, held-out rows' texts
    seconds: float
    # the judge's groups (gte_pro.scoring.judge) of each query's window, positive first: the teacher's scores, the
    # embedder's (the student that mined them), each ensemble member's standardised scores (name, kind, groups);
    # and the teacher's of the rows as written (positive, kept negatives): what distillation softmaxes over
    teacher_groups: np.ndarray | None = None
    student_groups: np.ndarray | None = None
    member_groups: list[tuple[str, str, np.ndarray]] = field(default_factory=list)
    file_groups: np.ndarray | None = None


# --- selection -----------------------------------------------------------------------------------------------------
def select_rescored(ids: torch.Tensor, scores: torch.Tensor, positive: torch.Tensor, options: MiningOptions,
                    first_row: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """From each query's window ``ids`` (Q, W) in embedder order (-1: no candidate), the teacher's ``scores`` of
    them (Q, W) and of its positive ``positive`` (Q,) (nan: none): (indices, teacher scores) of the kept negatives,
    (Q, num_negatives) best first (-1 / nan pad), and how many candidates each query dropped (Q,)."""
    valid = ids >= 0
    drop = valid & ((scores >= positive[:, None]) | _too_close(scores, positive, options))
    survivor = valid & ~drop
    # each column's place in the teacher's order: highest score first, equal scores by embedder rank (stable)
    by_teacher = torch.sort(torch.where(valid, -scores, math.inf), dim=1, stable=True).indices
    columns = torch.arange(ids.shape[1]).expand_as(ids)
    place = torch.empty_like(by_teacher).scatter_(1, by_teacher, columns)
    # sampling=random draws by embedder rank, as mining without a teacher does
    chosen, kept = pick_survivors(survivor, place, columns, options, first_row)
    take = chosen.shape[1]
    # best first by teacher score, then the padding
    order = torch.where(kept, place.gather(1, chosen), place.gather(1, chosen) + ids.shape[1])
    chosen = chosen.gather(1, torch.sort(order, dim=1).indices)
    kept = survivor.gather(1, chosen)
    out_ids = torch.full((ids.shape[0], options.num_negatives), -1, dtype=torch.long)
    out_scores = torch.full(out_ids.shape, math.nan)
    out_ids[:, :take] = torch.where(kept, ids.gather(1, chosen), -1)
    out_scores[:, :take] = torch.where(kept, scores.gather(1, chosen), math.nan)
    return out_ids, out_scores, drop.sum(1)


# --- scoring ------------------------------------------------------------------------------------------------------
class _Joined(Sequence[str]):
    """Two text tables read as one (the corpus, then the held-out rows' own texts), without copying the corpus."""

    def __init__(self, first: Sequence[str], second: Sequence[str]) -> None:
        self.first, self.second = first, second

    def __len__(self) -> int:
        return len(self.first) + len(self.second)

    def __getitem__(self, i: int) -> str:  # type: ignore[override]
        return self.first[i] if i < len(self.first) else self.second[i - len(self.first)]


def corpus_chars(corpus: Sequence[str]) -> np.ndarray:
    """Each document's length in characters, without reading a store's texts (its prefix taken off)."""
    if isinstance(corpus, MiningCorpus) and corpus.store is not None:
        prefix = len(corpus.store.meta["doc_prefix"])
        return np.concatenate([np.fromiter(map(len, corpus.texts), dtype=np.int64, count=len(corpus.texts)),
                               corpus.store.chars[corpus.rows].astype(np.int64) - prefix])
    return np.fromiter(map(len, corpus), dtype=np.int64, count=len(corpus))


def rescore_window(teacher: Teacher, queries: Sequence[str], corpus: Sequence[str],
                   positives: Sequence[Sequence[int]], window: MinedNegatives, options: MiningOptions,
                   batch_size: int, device: Any = "cpu",
                   held_out: Sequence[Any] = ()) -> tuple[MinedNegatives, Rescored]:
    """The teacher's judgement of ``window`` (the embedder's candidates, ``window_options``): the kept negatives
    with the teacher's scores (``MinedNegatives``: ``positive_scores`` the lowest positive teacher score a query,
    ``dropped_false_negatives`` the teacher's drops) and what the report and the file need (``Rescored``).
    ``held_out``: rows (``query``, ``positives``, ``negatives``) whose own texts are scored too, so that the whole
    mined file carries teacher scores. Collective under torch.distributed; every rank gets the same result."""
    start = time.perf_counter()
    ids = window.indices.cpu()
    counts = [len(p) for p in positives]
    pos_query = np.repeat(np.arange(len(positives), dtype=np.int64), counts)
    pos_doc = np.fromiter((d for p in positives for d in p), dtype=np.int64, count=sum(counts))
    win_row, win_col = (t.numpy() for t in torch.nonzero(ids >= 0, as_tuple=True))
    query_of = np.concatenate([pos_query, win_row])
    doc_of = np.concatenate([pos_doc, ids[win_row, win_col].numpy()])
    held_query = [ex.query for ex in held_out for _ in (*ex.positives, *ex.negatives)]
    held_doc = [doc for ex in held_out for doc in (*ex.positives, *ex.negatives)]
    query_chars = np.fromiter(map(len, queries), dtype=np.int64, count=len(queries))
    chars = np.concatenate([query_chars[query_of] + corpus_chars(corpus)[doc_of],
                            np.asarray([len(q) + len(d) for q, d in zip(held_query, held_doc, strict=True)],
                                       dtype=np.int64)])
    mined_pairs = len(query_of)
    held = np.arange(len(held_query), dtype=np.int64)
    members: list[torch.Tensor] = []
    scores = teacher_scores(teacher, _Joined(queries, held_query), _Joined(corpus, held_doc),
                            np.concatenate([query_of, len(queries) + held]),
                            np.concatenate([doc_of, len(corpus) + held]), batch_size, device, chars, members)
    if not bool(torch.isfinite(scores).all()):
        raise RuntimeError(f"rescoring: {int((~torch.isfinite(scores)).sum())} of {len(scores)} pairs have no finite "
                           f"teacher score: {teacher.name_or_path} returned nan/inf")
    positive = torch.full((len(queries),), math.inf).scatter_reduce(
        0, torch.from_numpy(pos_query), scores[: len(pos_query)], reduce="amin")
    positive = torch.where(torch.isinf(positive), math.nan, positive)
    judged = torch.full(ids.shape, math.nan)
    judged[torch.from_numpy(win_row), torch.from_numpy(win_col)] = scores[len(pos_query) : mined_pairs]
    out_ids, out_scores, dropped = select_rescored(ids, judged, positive, options)
    per_query = scores[: len(pos_query)].split(counts)
    held, offset = [], mined_pairs
    for ex in held_out:
        n, k = len(ex.positives), len(ex.negatives)
        held.append((scores[offset : offset + n].tolist(), scores[offset + n : offset + n + k].tolist()))
        offset += n + k
    mined = MinedNegatives(out_ids, out_scores, positive, int(dropped.sum()), int((out_ids < 0).any(1).sum()),
                           len(win_row))
    window_of = _window_scores(ids.shape, pos_query, win_row, win_col, mined_pairs)
    member_groups = [(member.name_or_path, member.kind, groups_from_window(*window_of(z)))
                     for member, z in zip(getattr(teacher, "members", []), members, strict=False)]
    return mined, Rescored(teacher.name_or_path, teacher.kind, [s.tolist() for s in per_query], held,
                           (ids >= 0).sum(1), dropped, len(chars), time.perf_counter() - start,
                           teacher_groups=groups_from_window(positive.numpy(), judged.numpy()),
                           student_groups=groups_from_window(window.positive_scores.cpu().float().numpy(),
                                                             window.scores.cpu().float().numpy()),
                           member_groups=member_groups,
                           file_groups=groups_from_window(positive.numpy(), out_scores.numpy()))


def _window_scores(shape: tuple[int, ...], pos_query: np.ndarray, win_row: np.ndarray, win_col: np.ndarray,
                   mined_pairs: int) -> Any:
    """A function from a job's pair scores (positives, then window candidates, in ``rescore_window``'s order) to
    (each query's lowest positive score (Q,), its window's scores (Q, W)): as the teacher's are laid out."""
    def split(scores: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        positive = torch.full((shape[0],), math.inf).scatter_reduce(
            0, torch.from_numpy(pos_query), scores[: len(pos_query)].float(), reduce="amin")
        window = torch.full(shape, math.nan)
        window[torch.from_numpy(win_row), torch.from_numpy(win_col)] = scores[len(pos_query) : mined_pairs].float()
        return torch.where(torch.isinf(positive), math.nan, positive).numpy(), window.numpy()
    return split
