"""The score group: teacher scores for every training row (mode=score)."""

from dataclasses import dataclass
from typing import Any


@dataclass
class ScoreSchema:
    """Teacher scores: ``mode=score`` (conf/score/default.yaml says what it writes)."""

    # the teacher (required with mode=score): a cross-encoder folder or hub name (gte-pro's rerank exports,
    # sentence-transformers CrossEncoder folders, BAAI/bge-reranker-*), or any embedder (cosine of the embeddings)
    teacher: str | None = None
    # null: a local folder says which by its config.json (*ForSequenceClassification: cross-encoder), a hub name is
    # read as a cross-encoder; cross-encoder or embedder to say it
    teacher_kind: str | None = None
    # the teacher's own code from the hub (like model.trust_remote_code): only for a teacher you trust
    trust_remote_code: Any = False
    # the JSON-lines training file to score; null: data.train_file (data=jsonl)
    input: str | None = None
    # the scored file (the input's rows, each with pos_scores and neg_scores); null: <run dir>/scored.jsonl
    output: str | None = None
    # pairs per teacher batch, and the teacher's truncation of a pair (tokens)
    batch_size: int = 64
    max_length: int = 512
    # rows per shard: the unit of work spread over the ranks and of resuming (a killed run loses at most the
    # shards in progress); scores do not depend on it, but a run folder's shards are resumed with the same value
    shard_rows: int = 1024
