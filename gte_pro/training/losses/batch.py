"""What every loss reads and returns: one step's embeddings gathered across devices (``GlobalBatch``), a loss's
result (``LossOutput``), and the collator's document block split into positives and hard negatives."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


@dataclass
class LossOutput:
    loss: torch.Tensor
    scores: torch.Tensor  # (B_local, num_candidates) query-document scores (``similarity``), before temperature
    labels: torch.Tensor  # (B_local,) column of each query's positive in ``scores``
    # this rank's query and positive embeddings (detached, full width), for the telemetry (gte_pro.training.telemetry)
    query: torch.Tensor | None = None
    positive: torch.Tensor | None = None
    # loss.false_negative_margin / loss.guide: the share of this rank's negative candidates masked (detached); None: off
    masked_share: torch.Tensor | None = None
    guide_masked_share: torch.Tensor | None = None


# loss.guide: the guide's (query, positive, hard negatives or None) embeddings of the batch, unit length, no grad
GuideEmbeddings = tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]


def split_documents(docs: torch.Tensor, batch_size: int,
                    num_negatives: int) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The collator's document block -> (positives ``(B, dim)``, hard negatives ``(B, k, dim)`` or None for k=0).

    ``docs`` holds the B positives first, then the k negatives of each query in query order.
    """
    positives = docs[:batch_size]
    if not num_negatives:
        return positives, None
    return positives, docs[batch_size:].reshape(batch_size, num_negatives, -1)


@dataclass
class GlobalBatch:
    """One step's embeddings, gathered once: the local rows and, from every rank, the candidate documents
    [all positives; all hard negatives] and (for losses that score them) all queries. Matryoshka truncates this;
    quantization-aware training quantizes it (and marks it ``scored_as_is``: quantized vectors are scored by the
    inner product, whatever the loss's ``similarity``)."""

    query: torch.Tensor  # (B_local, dim)
    positive: torch.Tensor  # (B_local, dim)
    candidates: torch.Tensor  # (B_global * (1 + k), dim)
    queries_all: torch.Tensor | None  # (B_global, dim)
    offset: int  # this rank's first row in the global batch
    num_negatives: int  # k: hard negatives per query
    negatives: torch.Tensor | None = None  # (B_local, k, dim): this rank's own hard negatives
    teacher: torch.Tensor | None = None  # (B_local, 1 + k) teacher scores of [positive, negatives] (distillation)
    # loss.guide: the guide's scores of the loss's terms (the layout of its partition function), at any width
    guide_scores: torch.Tensor | None = None
    scored_as_is: bool = False  # True: the inner product of the vectors as they are (quantized embeddings)

    def truncated(self, dim: int) -> GlobalBatch:
        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[..., :dim]

        return replace(self, query=self.query[..., :dim], positive=self.positive[..., :dim],
                       candidates=self.candidates[..., :dim], queries_all=cut(self.queries_all),
                       negatives=cut(self.negatives))
