"""The mine group: hard-negative mining (mode=mine and data.remine)."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II


@dataclass
class MineSchema:
    """Hard-negative mining: ``mode=mine`` and ``data.remine`` (conf/mine/default.yaml says what it writes)."""

    # negatives mined per query (fewer where the window holds fewer survivors; training fills the rest at random)
    num_negatives: int = 15
    # rank window [range_min, range_max), 0-based among the non-positive corpus entries sorted by score: skipping
    # the top range_min avoids the unlabelled positives that usually sit there
    range_min: int = 10
    range_max: int = 100
    # top: the best survivors of the window (NV-Retriever's TopK-PercPos); random: a uniform draw among them
    sampling: str = "top"
    # drop a candidate scoring above (1 - relative_margin) x the query's positive score; null: off
    relative_margin: float | None = 0.05
    # drop a candidate scoring above the positive score minus absolute_margin; null: off
    absolute_margin: float | None = None
    # drop a candidate scoring above this cosine score; null: off
    max_score: float | None = None
    # extra documents to mine from: JSON-lines files of {"text": ...} or BEIR corpus.jsonl lines
    corpus_files: Any = field(default_factory=list)
    # texts per embedding batch, and their truncation
    batch_size: int = II("data.eval_batch_size")
    max_length: int = II("data.max_length")
    # the mined JSON-lines file; null: <run dir>/mined.jsonl
    output: str | None = None
    # bounds the (queries x corpus) block of scores held in memory at once (entries; 2^24 = 64 MB of float32)
    max_scores_per_chunk: int = 2**24
    # a teacher that judges the window: each query's candidates [range_min, range_max) by the embedder are rescored
    # by it, a candidate it scores at or above the query's (lowest) positive is dropped, the margins and max_score
    # apply to its scores, and its scores are written as pos_scores/neg_scores (loss=distill_kl trains on them).
    # A task=rerank export, a cross-encoder or an embedder (folder or hub name); null: no rescoring. mode=mine only
    rescore_with: str | None = None
    # cross-encoder | embedder; null: a folder's config.json says (*ForSequenceClassification: a cross-encoder)
    rescore_kind: str | None = None
    # (query, document) pairs per teacher batch, and the teacher's truncation
    rescore_batch_size: int = 64
    rescore_max_length: int = 512
