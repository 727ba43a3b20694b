"""The eval group: validation sets, quantized and truncated retrieval."""

from dataclasses import dataclass, field
from typing import Any

from omegaconf import II

from gte_pro.config.schema.types import FLAG


@dataclass
class EvalSchema:
    """Retrieval sets in BEIR format, evaluated at every validation, at the end of training and by mode=eval."""

    # each entry: a folder (named after it, evaluated on `split`), or {path: folder, split: dev, name: scifact_dev}
    beir: Any = field(default_factory=list)
    split: str = "test"
    # texts per encoding batch (texts are sorted by length first, so batches carry little padding)
    batch_size: int | None = II("data.eval_batch_size")
    # truncation of queries and documents
    max_length: int | None = II("data.max_length")
    # also rank quantized embeddings (int8, binary) and report their NDCG@10 next to float32. []: float32 only
    quantization: list[str] = field(default_factory=list)
    # also evaluate the first d dimensions of the embeddings, for each d; by default loss.matryoshka_dims. null: none
    truncate_dims: list[int] | None = II("oc.select:loss.matryoshka_dims,null")
    # validate the untrained model before training too (val_before in metrics.json); false saves that pass
    before: FLAG = True
    # task=rerank: where the candidates a reranker reorders at validation come from: an embedder (a path or hub
    # name; its top rerank_depth documents of the validation corpus), or rows: each held-out query's own rows'
    # positives and negatives. task/rerank sets the packaged MiniLM
    retriever: str | None = None
    rerank_depth: int = 100
    retriever_batch_size: int = II("data.eval_batch_size")
