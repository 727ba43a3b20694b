"""Checks and decisions on what the rows carry, once they are read: whether any are left for training and
validation, the validation queries kept, the hard negatives each row's batch is given (``data.num_negatives``; null:
the rows' own), and whether a distillation loss finds the teacher scores and negatives it learns from."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from gte_pro.data.records import Example

log = logging.getLogger(__name__)


def negatives_per_row(setting: int | None, counts: np.ndarray, report: bool = True,
                      remined: int | None = None) -> int:
    """The hard negatives every training row is given: ``setting``, or with None (data.num_negatives=null) the
    most any row carries, so that a file's own negatives are all used (sentence-transformers uses every negative
    column it gets), and at least ``remined`` (what a re-mined row carries, mine.num_negatives) when re-mining.
    ``report``: log how many rows carry fewer (they get other rows' positives: random negatives)."""
    wanted = int(counts.max(initial=0)) if setting is None else setting
    if setting is None and remined is not None:
        wanted = max(wanted, remined)
    if not report:
        return wanted
    if wanted == 0:
        log.info("data: no hard negatives%s: each query is scored against the batch's other documents (in-batch "
                 "negatives)", " in the rows" if setting is None else " (data.num_negatives=0)")
        return wanted
    short = int((counts < wanted).sum())
    source = "data.num_negatives=null: the most any row carries" if setting is None else "data.num_negatives"
    if setting is None and remined is not None:
        source += f", or a re-mined row ({remined})"
    log.info("data: %d hard negative(s) per row (%s); the rows carry %d to %d (mean %.1f); %d of %d row(s) have "
             "fewer and are filled with other rows' positives (random negatives)", wanted, source,
             int(counts.min()) if len(counts) else 0, int(counts.max(initial=0)),
             float(counts.mean()) if len(counts) else 0.0, short, len(counts))
    return wanted


def score_first(source: str) -> str:
    return (f"score the file first (python train.py mode=score data=jsonl data.train_file={source} "
            "score.teacher=<reranker>) and train on its scored.jsonl")


def mine_then_score(source: str) -> str:
    """The fix for rows without hard negatives: scoring adds none (it scores the negatives a row has); mining
    does."""
    return (f"mine hard negatives first (python train.py mode=mine data=jsonl data.train_file={source}), score the "
            "mined file (python train.py mode=score data=jsonl data.train_file=<mine run>/mined.jsonl "
            "score.teacher=<reranker>) and train on its scored.jsonl (or both in one run: mode=mine "
            "mine.rescore_with=<reranker>)")


def distill_problem(loss: str | None, source: str, scored: bool, negatives: int) -> tuple[str, str] | None:
    """(what, how to fix it) of what a distillation loss (``loss``; None: none trains) lacks in the rows of
    ``source``; None when they carry teacher scores and hard negatives."""
    if loss is None:
        return None
    missing = [what for what, present in (("teacher scores (pos_scores, neg_scores)", scored),
                                          ("hard negatives", negatives)) if not present]
    if not missing:
        return None
    what = f"{source}: loss={loss} needs {' and '.join(missing)} in the training rows, and they have none"
    if scored:
        what += " (scoring adds no negatives: mining does)"
    return what, (score_first(source) if negatives else mine_then_score(source)) + ", or choose loss=infonce"


def rows_problem(source: str, train_count: int, val_count: int, reports: list[dict[str, Any]],
                 val_fraction: float) -> str | None:
    """Why the rows of ``source`` cannot train (none left after cleaning) or validate (none held out); None if
    they can."""
    if not train_count:
        dropped = "; ".join(f"{r['source']}: {r['dropped']}" for r in reports)
        return f"{source}: no training rows left after cleaning ({dropped})"
    if not val_count:
        return (f"{source}: no validation rows: provide a validation file or raise data.val_fraction "
                f"(now {val_fraction})")
    return None


def cap_validation(val: list[Example], distractors: list[str], max_queries: int | None
                   ) -> tuple[list[Example], list[str]]:
    """At most ``max_queries`` validation queries; the capped queries' positives stay in the corpus as
    distractors, so the task stays as hard."""
    if max_queries and len(val) > max_queries:
        distractors = [p for ex in val[max_queries:] for p in ex.positives] + distractors
        val = val[:max_queries]
    return val, distractors
