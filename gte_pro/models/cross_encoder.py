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

from gte_pro.models.length_chunks import chunks_for, parse_length_chunks, pass_plan, run_in_chunks
from gte_pro.models.loading import (
    avoid_cudnn_attention,
    check_trust_remote_code,
    enable_gradient_checkpointing,
    load_tokenizer,
    load_weights,
    random_config,
)
from gte_pro.models.pairs import PairBatcher

log = logging.getLogger(__name__)


class CrossEncoder(nn.Module):
    """Sequence-classification transformer with one output: ``forward`` -> one logit per pair (float, shape (N,))."""

    def __init__(
        self,
        name_or_path: str,
        max_length: int = 512,
        trust_remote_code: bool = False,
        attn_implementation: str | None = "sdpa",
        random_init_config: dict[str, Any] | None = None,
        gradient_checkpointing: bool = False,
        compile: bool = False,
        length_chunks: int | str = "auto",
        query_prefix: str = "",
        doc_prefix: str = "",
    ) -> None:
        super().__init__()
        check_trust_remote_code(trust_remote_code)
        self.name_or_path = str(name_or_path)
        self.tokenizer = load_tokenizer(self.name_or_path, trust_remote_code)
        if random_init_config is not None:
            # a small randomly initialised BERT with the named tokenizer (tests, debugging)
            config = random_config(self.tokenizer, random_init_config, num_labels=1)
            self.backbone: nn.Module = AutoModelForSequenceClassification.from_config(
                config, attn_implementation=attn_implementation)
        else:
            # a checkpoint with a trained one-logit head keeps it; an embedder (no head) gets a new one, which
            # transformers reports: that report is the expected start of a reranker, not a problem
            self.backbone = load_weights(AutoModelForSequenceClassification, self.name_or_path, trust_remote_code,
                                         attn_implementation, num_labels=1)
        self.backbone.train()  # from_pretrained returns eval mode; train with dropout like the peers
        avoid_cudnn_attention()
        self.max_length = int(max_length)
        self.pairs = PairBatcher(self.tokenizer, self.max_length)
        self.length_chunks = 1 if compile else parse_length_chunks(length_chunks)
        self.query_prefix, self.doc_prefix = query_prefix, doc_prefix
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.backbone)
        if compile:
            self.backbone.compile(dynamic=True)
        log.info("cross-encoder %s: max_length=%d", self.name_or_path, self.max_length)

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
