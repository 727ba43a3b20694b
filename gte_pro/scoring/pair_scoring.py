"""Every (query, document) pair of a job through the teacher, each text read once: the collective scoring that
``mode=score`` and ``mode=mine mine.rescore_with=`` share.

A job's pairs are given as two text tables and, per pair, an index into each (``query_of``, ``doc_of``):

- a **cross-encoder** reads every pair: the pairs are sorted by characters (longest first, then pair order) and cut
  into batches of ``batch_size``; rank r of W scores batches r, r + W, ... (one ``teacher.score`` call a batch);
- an **embedder** embeds each distinct text once per job (a query recurs with each of its candidates, a document
  in the windows of many queries): the distinct queries and the distinct documents, each sorted by characters and
  cut into batches that the ranks share the same way; the embeddings are gathered to every rank and a pair's score
  is the dot product of its two (the cosine, for an embedder that normalises). On 2,000 rows with a window of 40
  this embeds ~4,000 texts instead of ~78,000 pairs' worth (``make bench-teacher-speed``);
- an **ensemble** (``EnsembleTeacher``) scores the job with each member, standardises each member's scores over
  all the job's pairs (z = (s - mean) / std, in float64) and averages them: members on different scales (a
  cross-encoder's logits, an embedder's cosines) weigh the same, and the average is on a unit scale.

A batch is made from the texts alone, never from which rank scores it, so every score (and every file made from
them) is the same for any number of ranks. Every rank gets every score.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from gte_pro.models.teacher import EmbedderTeacher, EnsembleTeacher, Teacher, standardised
from gte_pro.retrieval import all_gather_rows
from gte_pro.utils.distributed import world
from gte_pro.utils.progress import Progress


def rank_batches(chars: np.ndarray, batch_size: int) -> list[np.ndarray]:
    """This rank's batches of the items (indices), longest first: batch b of the length order goes to rank
    b % world_size."""
    order = np.lexsort((np.arange(len(chars)), -np.asarray(chars, dtype=np.int64)))
    rank, world_size = world()
    return [order[start : start + batch_size]
            for start in range(rank * batch_size, len(order), world_size * batch_size)]


def _gathered(local: torch.Tensor, batches: list[np.ndarray], total: int, device: Any) -> torch.Tensor:
    """Every rank's rows (``local``, in the order of its ``batches``) put back in item order, on the CPU."""
    index = torch.from_numpy(np.concatenate(batches) if batches else np.empty(0, dtype=np.int64))
    values, _ = all_gather_rows(local.to(device))
    where, _ = all_gather_rows(index.to(device))
    out = torch.full((total, *local.shape[1:]), math.nan)
    out[where.cpu()] = values.cpu().float()
    if len(where) != total:
        raise RuntimeError(f"teacher scoring: {len(where)} of {total} rows came back from the ranks")
    return out


def _note() -> str:
    rank, world_size = world()
    return f" (rank 0's share of {world_size} ranks)" if world_size > 1 else ""


def cross_encoder_scores(teacher: Teacher, query_texts: Sequence[str], doc_texts: Sequence[str],
                         query_of: np.ndarray, doc_of: np.ndarray, batch_size: int, device: Any,
                         chars: np.ndarray | None = None) -> torch.Tensor:
    """Each pair read by the teacher (its own batches, shared over the ranks); ``chars``: each pair's length
    (default: the characters of its two texts)."""
    if chars is None:
        chars = np.fromiter((len(query_texts[q]) + len(doc_texts[d]) for q, d in zip(query_of, doc_of, strict=True)),
                            dtype=np.int64, count=len(query_of))
    batches = rank_batches(chars, batch_size)
    count = sum(map(len, batches))
    progress = Progress("scoring pairs with the teacher", count, unit="pairs", quiet=world()[0] != 0, note=_note())
    local, done = torch.empty(count), 0
    for batch in batches:
        queries = [query_texts[int(query_of[i])] for i in batch]
        docs = [doc_texts[int(doc_of[i])] for i in batch]
        local[done : done + len(batch)] = teacher.score(queries, docs, batch_size=len(batch)).float().cpu()
        done += len(batch)
        progress.update(done)
    progress.finish()
    return _gathered(local, batches, len(query_of), device)


def embed_once(teacher: EmbedderTeacher, texts: Sequence[str], prefix: str, batch_size: int, device: Any,
               what: str) -> torch.Tensor:
    """(len(texts), dim) float32 embeddings of ``prefix + text`` for distinct ``texts``, each embedded once over all
    the ranks (batches of similar lengths, shared out, gathered)."""
    chars = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    batches = rank_batches(chars, batch_size)
    count = sum(map(len, batches))
    progress = Progress(f"embedding {what} with the teacher", count, quiet=world()[0] != 0, note=_note())
    local, done = torch.empty(count, teacher.model.dim), 0
    for batch in batches:
        local[done : done + len(batch)] = teacher.model.encode([prefix + texts[i] for i in batch], len(batch))
        done += len(batch)
        progress.update(done)
    progress.finish()
    return _gathered(local, batches, len(texts), device)


def _distinct(texts: Sequence[str], used: np.ndarray) -> tuple[list[str], np.ndarray]:
    """The distinct texts among ``texts[used]`` (first appearance in index order) and, per table index, its row
    among them (-1: not used)."""
    indices = np.unique(used)
    row_of_text: dict[str, int] = {}
    rows = np.full(len(texts), -1, dtype=np.int64)
    for i in indices.tolist():
        rows[i] = row_of_text.setdefault(texts[i], len(row_of_text))
    return list(row_of_text), rows


def embedder_scores(teacher: EmbedderTeacher, query_texts: Sequence[str], doc_texts: Sequence[str],
                    query_of: np.ndarray, doc_of: np.ndarray, batch_size: int, device: Any) -> torch.Tensor:
    """Each pair's similarity, from each distinct query and document embedded once."""
    queries, query_row = _distinct(query_texts, query_of)
    docs, doc_row = _distinct(doc_texts, doc_of)
    query_emb = embed_once(teacher, queries, teacher.model.query_prefix, batch_size, device, "queries")
    doc_emb = embed_once(teacher, docs, teacher.model.doc_prefix, batch_size, device, "documents")
    q_rows, d_rows = torch.from_numpy(query_row[query_of]), torch.from_numpy(doc_row[doc_of])
    out = torch.empty(len(query_of))
    for start in range(0, len(out), 65536):  # bounded memory: (chunk, dim) gathered rows at a time
        part = slice(start, start + 65536)
        out[part] = (query_emb[q_rows[part]] * doc_emb[d_rows[part]]).sum(dim=-1)
    return out


def teacher_scores(teacher: Teacher, query_texts: Sequence[str], doc_texts: Sequence[str], query_of: np.ndarray,
                   doc_of: np.ndarray, batch_size: int, device: Any = "cpu",
                   chars: np.ndarray | None = None, members_out: list[torch.Tensor] | None = None) -> torch.Tensor:
    """The teacher's float32 score of every pair (n,), on the CPU, on every rank (collective under
    torch.distributed); see the module doc for how each kind reads the pairs. Non-finite scores are passed on: the
    caller names the rows they belong to. ``members_out``: a list that gets an ensemble's members' standardised
    scores, one (n,) tensor each (the report judges each member)."""
    query_of, doc_of = np.asarray(query_of, dtype=np.int64), np.asarray(doc_of, dtype=np.int64)
    if isinstance(teacher, EnsembleTeacher):
        members = [standardised(teacher_scores(member, query_texts, doc_texts, query_of, doc_of, batch_size,
                                               device, chars)) for member in teacher.members]
        if members_out is not None:
            members_out.extend(members)
        out = torch.stack(members).double().mean(0).float()
    elif isinstance(teacher, EmbedderTeacher):
        out = embedder_scores(teacher, query_texts, doc_texts, query_of, doc_of, batch_size, device)
    else:
        out = cross_encoder_scores(teacher, query_texts, doc_texts, query_of, doc_of, batch_size, device, chars)
    return out
