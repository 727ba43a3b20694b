"""The eval group: validation sets, quantized and truncated retrieval."""

from dataclasses import dataclass
from typing import Any

from omegaconf import II

from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.rules import int_list, integer, subset, text
from gte_pro.config.schema.types import FLAG, setting


@dataclass
class EvalSchema:
    """Retrieval sets in BEIR format, evaluated at every validation, at the end of training and by mode=eval."""

    beir: Any = setting([], "BEIR sets: each a folder (named after it, evaluated on `split`), or {path: folder, "
                        "split: dev, name: scifact_dev}")
    split: str = setting("test", "the qrels split of the folders given as plain paths")
    batch_size: int | None = setting(II("data.eval_batch_size"), "texts per encoding batch (sorted by length "
                                     "first, so batches carry little padding)", integer(1, optional=True))
    max_length: int | None = setting(II("data.max_length"), "truncation of queries and documents",
                                     integer(1, optional=True))
    quantization: list[str] = setting([], "also rank int8 and/or binary embeddings and report their NDCG@10 next to "
                                      "float32; []: float32 only", subset("int8", "binary"))
    truncate_dims: list[int] | None = setting(II("oc.select:loss.matryoshka_dims,null"), "also evaluate the first d "
                                              "dimensions, for each d; by default loss.matryoshka_dims; null: none",
                                              int_list(1))
    telemetry_every_n_steps: int | None = setting(50, "log telemetry/* (in-batch false-negative rate, alignment, "
                                                  "uniformity, teacher agreement) every N training steps, from the "
                                                  "loss's own embeddings; 0 or null: off", integer(0, optional=True))
    before: FLAG = setting(True, "validate the untrained model before training too (val_before in metrics.json)",
                           IS_FLAG)
    retriever: str | None = setting(None, "task=rerank: the embedder whose top rerank_depth documents of the "
                                    "validation corpus are reranked (a path or hub name), or `rows` (each held-out "
                                    "query's own rows); task/rerank sets the packaged MiniLM", text(optional=True))
    rerank_depth: int = setting(100, "task=rerank: documents reranked per query", integer(1))
    retriever_batch_size: int = setting(II("data.eval_batch_size"), "task=rerank: texts per batch of the retriever",
                                        integer(1))
