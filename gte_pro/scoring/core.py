"""Scoring the shards: every row's (query, positive) and (query, negative) pairs through the teacher.

``plan_shards`` reads the whole input first, on every rank: a bad row is reported (file, line, field) before
anything is scored, a shard scored by an earlier run with another teacher or from other rows is refused at once,
and every rank knows how many shards there are and which are done. ``score_rank`` then scores the missing shards of
this rank. A shard's pairs go to the teacher in one call, in row order (each row's positives, then its negatives),
so batches are formed from the shard alone: a pair's score is the same for any world size and after a resume.
An embedder teacher, or an ensemble, scores the whole file first (``file_scores``: each distinct text embedded once
per job, members standardised over all the file's pairs; ``gte_pro.scoring.pair_scoring``), and the shards are then
written from those scores; the batches are made from the whole file, so again from neither the ranks nor the
shards already done.

Texts go to the teacher as training reads them: cut at ``MAX_TEXT_CHARS`` and cleaned (``clean_text``); the
output keeps the rows as written. Scores are float32, written as the shortest decimal that reads back to the same
float32 (``0.83514124``), so the file is the same bytes wherever it is made.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gte_pro.data.cache import file_signature
from gte_pro.data.records import MAX_TEXT_CHARS, clean_text
from gte_pro.errors import ConfigError, DataError
from gte_pro.models.teacher import CrossEncoderTeacher, EnsembleTeacher, Teacher
from gte_pro.scoring.pair_scoring import teacher_scores
from gte_pro.scoring.shards import Shard, ShardFolder, iter_shards
from gte_pro.utils.distributed import world

log = logging.getLogger(__name__)
LOG_EVERY_S = 10.0


@dataclass
class ShardPlan:
    """What the input holds and what an earlier run in this folder already scored (the same on every rank)."""

    digests: list[str] = field(default_factory=list)  # per shard
    done: list[bool] = field(default_factory=list)  # per shard: scored by an earlier run, reusable
    rows: int = 0
    pairs: int = 0
    pending_pairs: int = 0  # pairs of the shards still to score

    @property
    def shards(self) -> int:
        return len(self.digests)


def scores_whole_file(teacher: Teacher) -> bool:
    """Whether the teacher scores the whole file before the shards are written (``file_scores``): an embedder
    (each text embedded once per job) or an ensemble (standardised over the file's pairs)."""
    return not isinstance(teacher, CrossEncoderTeacher)


def _teacher_identity(teacher: Teacher) -> dict[str, Any]:
    folder = Path(teacher.name_or_path).expanduser()
    local = folder.is_dir()
    return {"teacher": str(folder.resolve()) if local else teacher.name_or_path, "kind": teacher.kind,
            "teacher_files": file_signature(folder) if local else None}


def teacher_settings(teacher: Teacher, max_length: int, batch_size: int, shard_rows: int,
                     precision: str) -> dict[str, Any]:
    """What a shard's scores depend on: a resumed run must have the same (a local teacher folder is known by its
    files' sizes and times, so a teacher retrained in place counts as another; an ensemble by its members)."""
    identity = ({"teacher": [_teacher_identity(member) for member in teacher.members], "kind": teacher.kind,
                 "teacher_files": None} if isinstance(teacher, EnsembleTeacher) else _teacher_identity(teacher))
    return {**identity, "max_length": max_length, "batch_size": batch_size, "shard_rows": shard_rows,
            "precision": precision, "batches": "file" if scores_whole_file(teacher) else "shard"}


def teacher_text(text: str) -> str:
    return clean_text(text[:MAX_TEXT_CHARS])


def plan_shards(path: str | Path, shard_rows: int, shards: ShardFolder) -> ShardPlan:
    plan = ShardPlan()
    for shard in iter_shards(path, shard_rows):
        digest = shard.digest()
        pairs = sum(len(row.example.positives) + len(row.example.negatives) for row in shard.rows)
        done = shards.finished(shard.index, digest) is not None
        plan.digests.append(digest)
        plan.done.append(done)
        plan.rows += len(shard.rows)
        plan.pairs += pairs
        plan.pending_pairs += 0 if done else pairs
    return plan


def float32_text(value: float) -> float:
    """The float32 ``value`` as the shortest decimal that reads back to it (JSON then writes those digits)."""
    return float(str(np.float32(value)))


def shard_pairs(shard: Shard) -> tuple[list[str], list[str]]:
    """The (query, document) texts of a shard's pairs in row order, each row's positives then its negatives."""
    queries, docs = [], []
    for row in shard.rows:
        query = teacher_text(row.example.query)
        for text in row.example.positives + row.example.negatives:
            queries.append(query)
            docs.append(teacher_text(text))
    return queries, docs


def file_scores(teacher: Teacher, path: str | Path, shard_rows: int, batch_size: int, device: Any = "cpu",
                context: Callable[[], Any] = contextlib.nullcontext,
                members_out: list[torch.Tensor] | None = None) -> list[np.ndarray]:
    """The teacher's scores of the whole file's pairs, per shard (collective: ``gte_pro.scoring.pair_scoring``);
    ``members_out`` gets an ensemble's members' standardised scores of all the pairs (``teacher_scores``)."""
    queries, docs, counts = [], [], []
    for shard in iter_shards(path, shard_rows):
        shard_queries, shard_docs = shard_pairs(shard)
        queries += shard_queries
        docs += shard_docs
        counts.append(len(shard_docs))
    query_table = list(dict.fromkeys(queries))
    query_row = {text: i for i, text in enumerate(query_table)}
    query_of = np.fromiter((query_row[text] for text in queries), dtype=np.int64, count=len(queries))
    with context():
        scores = teacher_scores(teacher, query_table, docs, query_of, np.arange(len(docs)), batch_size, device,
                                members_out=members_out)
    return np.split(scores.numpy(), np.cumsum(counts)[:-1])


def score_shard(teacher: Teacher, shard: Shard, batch_size: int, source: str,
                context: Callable[[], Any] = contextlib.nullcontext,
                scores: np.ndarray | None = None) -> tuple[list[str], dict[str, Any]]:
    """The scored lines of one shard (each row as read, plus pos_scores and neg_scores) and its numbers for the
    report: the scores, and how many negatives score at least their row's best positive (likely false negatives).
    ``scores``: the shard's pair scores when the teacher made them already (``file_scores``)."""
    start = time.perf_counter()
    queries, docs = shard_pairs(shard)
    if scores is None:
        with context():
            scores = teacher.score(queries, docs, batch_size).float().cpu().numpy()
    lines, positives, negatives, suspects, at = [], [], [], 0, 0
    for row in shard.rows:
        values = scores[at : at + len(row.example.positives) + len(row.example.negatives)]
        at += len(values)
        if not np.isfinite(values).all():
            raise ConfigError(f"teacher {teacher.name_or_path} gave a non-finite score ({values.tolist()}) to the "
                              f"pairs of {source}, line {row.line}",
                              hint="score with precision=32-true, or check the teacher")
        pos = [float32_text(v) for v in values[: len(row.example.positives)]]
        neg = [float32_text(v) for v in values[len(row.example.positives) :]]
        suspects += sum(score >= max(pos) for score in neg)
        positives += pos
        negatives += neg
        lines.append(json.dumps({**row.record, "pos_scores": pos, "neg_scores": neg}, ensure_ascii=False))
    stats = {"first_line": shard.rows[0].line, "rows": len(shard.rows), "pairs": len(queries),
             "likely_false_negatives": suspects, "seconds": round(time.perf_counter() - start, 3),
             "pos_scores": positives, "neg_scores": negatives}
    return lines, stats


def score_rank(teacher: Teacher, path: str | Path, shard_rows: int, batch_size: int, shards: ShardFolder,
               plan: ShardPlan, context: Callable[[], Any] = contextlib.nullcontext,
               scores: list[np.ndarray] | None = None) -> dict[str, float]:
    """Score this rank's missing shards (``index % world_size == rank``, the ranks of ``world()``), writing each as
    it is done; rank 0 logs its progress (shards done of its share, pairs per second). ``scores``: every shard's
    pair scores, when the teacher scored the whole file (``file_scores``). Returns this rank's pairs and seconds."""
    rank, world_size = world()
    mine = [i for i in range(plan.shards) if i % world_size == rank]
    pending = {i for i in mine if not plan.done[i]}
    start = last_log = time.perf_counter()
    pairs = done = 0
    if rank == 0:
        log.info("score: %d rows, %d pairs in %d shards; %d shards scored before, %d to score over %d rank(s)",
                 plan.rows, plan.pairs, plan.shards, sum(plan.done), plan.shards - sum(plan.done), world_size)
    for shard in iter_shards(path, shard_rows) if pending else ():
        if shard.index not in pending:
            continue
        if shard.digest() != plan.digests[shard.index]:
            raise DataError(f"{path}: changed while it was being scored (rows from line {shard.rows[0].line})",
                            hint="score a file that nothing writes to while it runs")
        lines, stats = score_shard(teacher, shard, batch_size, str(path), context,
                                   None if scores is None else scores[shard.index])
        shards.write(shard.index, plan.digests[shard.index], lines, {**stats, "rank": rank, "world_size": world_size})
        pairs += stats["pairs"]
        done += 1
        pending.discard(shard.index)
        now = time.perf_counter()
        if rank == 0 and (now - last_log >= LOG_EVERY_S or not pending or done == 1):
            last_log = now
            log.info("score: shard %d done; %d / %d shards of rank 0 (%d in all), %.0f pairs/s", shard.index,
                     len(mine) - len(pending), len(mine), plan.shards, pairs / max(now - start, 1e-9))
        if not pending:
            break
    if pending:
        raise DataError(f"{path}: changed while it was being scored (shard {min(pending)} is no longer there)",
                        hint="score a file that nothing writes to while it runs")
    return {"pairs": pairs, "seconds": time.perf_counter() - start}


def quantiles(values: Any) -> dict[str, float | int | None]:
    """count, mean and quantiles of a list of scores (None where it is empty)."""
    array = np.asarray(values, dtype=np.float64)
    names = {"min": 0.0, "p05": 0.05, "p25": 0.25, "median": 0.5, "p75": 0.75, "p95": 0.95, "max": 1.0}
    if array.size == 0:
        return {"count": 0, "mean": None, **dict.fromkeys(names)}
    return {"count": int(array.size), "mean": round(float(array.mean()), 4),
            **{name: round(float(np.quantile(array, q)), 4) for name, q in names.items()}}
