"""The score group: teacher scores for every training row (mode=score)."""

from dataclasses import dataclass
from typing import Any

from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.rules import choice, integer, teachers, text
from gte_pro.config.schema.mining import TEACHER_KINDS
from gte_pro.config.schema.types import setting


@dataclass
class ScoreSchema:
    """Teacher scores: ``mode=score`` (conf/score/default.yaml says what it writes)."""

    teacher: Any = setting(None, "the teacher (required with mode=score): a cross-encoder folder or hub name "
                           "(rerank exports, CrossEncoder folders, BAAI/bge-reranker-*), or any embedder; a list: an "
                           "ensemble, each member's scores standardised over the file's pairs, averaged", teachers())
    teacher_kind: str | None = setting(None, "cross-encoder or embedder; null: a local folder's config.json says, a "
                                       "hub name is read as a cross-encoder", choice(*TEACHER_KINDS, None))
    trust_remote_code: Any = setting(False, "the teacher's own code from the hub: only for a teacher you trust",
                                     IS_FLAG)
    student: str | None = setting(None, "an embedder (folder or hub name) judged next to the teacher on the rows' "
                                  "own labels, e.g. the model that mined them; a distillation run refuses a teacher "
                                  "that ranks positives first less often; null: the teacher alone",
                                  text(optional=True))
    input: str | None = setting(None, "the JSON-lines training file to score; null: data.train_file (data=jsonl)",
                                text(optional=True))
    output: str | None = setting(None, "the scored file (each row with pos_scores and neg_scores); null: <run "
                                 "dir>/scored.jsonl", text(optional=True))
    batch_size: int = setting(64, "pairs per teacher batch", integer(1))
    max_length: int = setting(512, "the teacher's truncation of a pair (tokens)", integer(1))
    shard_rows: int = setting(1024, "rows per shard: the unit of work spread over the ranks and of resuming; a run "
                              "folder's shards are resumed with the same value", integer(1))
