"""The mine group: hard-negative mining (mode=mine and data.remine)."""

from dataclasses import dataclass
from typing import Any

from omegaconf import II

from gte_pro.config.rules import choice, integer, number, teachers, text
from gte_pro.config.schema.types import setting

SAMPLING = ("top", "random")
TEACHER_KINDS = ("cross-encoder", "embedder")


@dataclass
class MineSchema:
    """Hard-negative mining: ``mode=mine`` and ``data.remine`` (conf/mine/default.yaml says what it writes)."""

    num_negatives: int = setting(15, "negatives mined per query (fewer where the window holds fewer survivors; "
                                 "training fills the rest at random)", integer(1))
    range_min: int = setting(10, "rank window [range_min, range_max), 0-based among the non-positive corpus entries "
                             "by score: skipping the top avoids unlabelled positives", integer(0))
    range_max: int = setting(100, "the end of the rank window (exclusive)", integer(1))
    sampling: str = setting("top", "top: the best survivors of the window (NV-Retriever's TopK-PercPos); random: a "
                            "uniform draw among them", choice(*SAMPLING))
    relative_margin: float | None = setting(0.05, "drop a candidate scoring above (1 - m) x the query's positive "
                                            "score; null: off", number(0, optional=True))
    absolute_margin: float | None = setting(None, "drop a candidate scoring above the positive's score minus m; "
                                            "null: off", number(0, optional=True))
    max_score: float | None = setting(None, "drop a candidate scoring above this; null: off", number(optional=True))
    corpus_files: Any = setting([], "extra documents to mine from: JSON-lines files of {\"text\": ...} or BEIR "
                                "corpus.jsonl lines")
    batch_size: int = setting(II("data.eval_batch_size"), "texts per embedding batch", integer(1))
    max_length: int = setting(II("data.max_length"), "truncation of the texts embedded", integer(1))
    output: str | None = setting(None, "the mined JSON-lines file; null: <run dir>/mined.jsonl", text(optional=True))
    max_scores_per_chunk: int = setting(2**24, "bounds the (queries x corpus) block of scores held at once "
                                        "(entries; 2^24 = 64 MB of float32)", integer(1))
    rescore_with: Any = setting(
        None, "a teacher that judges the window (mode=mine only): a task=rerank export, a cross-encoder or an "
        "embedder, or a list of them (an ensemble: standardised scores, averaged); drops candidates it scores at or "
        "above the positive, and writes pos_scores/neg_scores (for loss=distill_kl); null: no rescoring",
        teachers())
    rescore_kind: str | None = setting(None, "cross-encoder or embedder; null: a folder's config.json says "
                                       "(*ForSequenceClassification: a cross-encoder)", choice(None, *TEACHER_KINDS))
    rescore_batch_size: int = setting(64, "(query, document) pairs per teacher batch", integer(1))
    rescore_max_length: int = setting(512, "the teacher's truncation", integer(1))
