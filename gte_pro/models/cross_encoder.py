"""The reranker: a cross-encoder that reads a (query, document) pair as one sequence and returns one relevance
logit, a Hugging Face ``AutoModelForSequenceClassification`` with one label (what sentence-transformers'
``CrossEncoder``, FlagEmbedding's rerankers and Alibaba's gte-*-reranker checkpoints are).

It takes the embedder's model keys where they mean the same (``name_or_path``, ``max_length``,
``trust_remote_code``, ``attn_implementation``, ``random_init_config``, ``gradient_checkpointing``, ``compile``,
``length_chunks``, prompts) and tokenizes pairs through ``gte_pro.models.pairs.PairTemplate``, the same joining the
training batches use, so a score at training, validation, ``mode=score`` and in an export is of the same input.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import AutoModelForSequenceClassification

from gte_pro.models.backbone import Backbone
from gte_pro.models.length_chunks import chunks_for, parse_length_chunks, pass_plan, run_in_chunks
from gte_pro.models.pairs import PairBatcher

log = logging.getLogger(__name__)


class CrossEncoder(nn.Module):
    """Sequence-classification transformer with one output: ``forward`` -> one logit per pair (float, shape (N,)).
    Composed from a ``Backbone`` (gte_pro.models.backbone); ``CrossEncoder.load`` builds it from the config's keys
    (it is the ``model/`` group's ``_target_`` with ``task=rerank``)."""

    def __init__(
        self,
        backbone: Backbone,
        *,
        max_length: int = 512,
        length_chunks: int | str = "auto",
        query_prefix: str = "",
        doc_prefix: str = "",
    ) -> None:
        if not isinstance(backbone, Backbone):
            raise TypeError(f"CrossEncoder(backbone) takes its part; for a folder or hub name ({backbone!r}) use "
                            "CrossEncoder.load(name_or_path, **options)")
        super().__init__()
        self.name_or_path = backbone.name_or_path
        self.tokenizer = backbone.tokenizer
        self.backbone: nn.Module = backbone.model
        self.max_length = int(max_length)
        self.pairs = PairBatcher(self.tokenizer, self.max_length)
        # a compiled backbone would recompile for every chunk shape
        self.length_chunks = 1 if backbone.compiled else parse_length_chunks(length_chunks)
        self.query_prefix, self.doc_prefix = query_prefix, doc_prefix
        log.info("cross-encoder %s: max_length=%d", self.name_or_path, self.max_length)

    @classmethod
    def load(
        cls,
        name_or_path: str,
        *,
        max_length: int = 512,
        trust_remote_code: bool = False,
        attn_implementation: str | None = "sdpa",
        random_init_config: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        compile: bool = False,
        length_chunks: int | str = "auto",
        query_prefix: str = "",
        doc_prefix: str = "",
    ) -> CrossEncoder:
        """The cross-encoder that the ``model/`` keys describe (conf/model/cross_encoder.yaml; CrossEncoderSchema
        documents each), and the way to open a reranker folder or hub name: ``CrossEncoder.load(path)``. A
        checkpoint with a trained one-logit head keeps it; an embedder (no head) gets a new one, which transformers
        reports: that report is the expected start of a reranker, not a problem."""
        backbone = Backbone.load(name_or_path, AutoModelForSequenceClassification,
                                 trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
                                 random_init_config=random_init_config, num_labels=1)
        backbone.memory_switches(gradient_checkpointing, compile)
        return cls(backbone, max_length=max_length, length_chunks=length_chunks, query_prefix=query_prefix,
                   doc_prefix=doc_prefix)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        plan = pass_plan(attention_mask, chunks_for(self.length_chunks, attention_mask.device.type))
        if plan is None:
            return self._logits(input_ids, attention_mask, **extra)
        return run_in_chunks(self._logits, plan, input_ids, attention_mask, **extra)

    def _logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        return self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra).logits[:, 0]

    def tokenize_pairs(self, queries: Sequence[str], docs: Sequence[str]) -> dict[str, torch.Tensor]:
        """Padded features of (query, document) pairs, joined as the training batches join them."""
        def ids(texts: list[str]) -> list[list[int]]:
            return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

        return self.pairs(ids([self.query_prefix + q for q in queries]), ids([self.doc_prefix + d for d in docs]))

    @torch.inference_mode()
    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """The logit of each (queries[i], docs[i]) pair (float32, on CPU), in the order given; batches are
        length-sorted."""
        if len(queries) != len(docs):
            raise ValueError(f"score: {len(queries)} queries for {len(docs)} documents")
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        order = sorted(range(len(queries)), key=lambda i: len(queries[i]) + len(docs[i]), reverse=True)
        out = torch.empty(len(queries))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            features = self.tokenize_pairs([queries[i] for i in idx], [docs[i] for i in idx])
            out[idx] = self(**{k: v.to(device) for k, v in features.items()}).float().cpu()
        self.train(was_training)
        return out

    def save(self, folder: str | Path) -> None:
        """Weights and tokenizer in Hugging Face layout (``AutoModelForSequenceClassification`` reads it)."""
        self.backbone.save_pretrained(str(folder), safe_serialization=True)
        self.tokenizer.save_pretrained(str(folder))
