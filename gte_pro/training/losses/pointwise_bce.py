"""Pointwise binary cross-entropy for rerankers (``loss=pointwise_bce``).

A reranker (cross-encoder) loss over groups of pair logits: one row's query with its positive, then with each of
its k hard negatives (``GroupCollator``: ``logits`` of shape (B, 1 + k), the positive in column 0). Every group is
scored on its own (no in-batch coupling), so DDP's gradient average over N ranks of B rows each trains exactly like
one process with N*B rows, and gradient accumulation is exact too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gte_pro.training.losses.batch import LossOutput
from gte_pro.training.losses.listwise import positive_first_labels
from gte_pro.training.losses.partition import at_least_fp32


class PointwiseBCELoss(nn.Module):
    """Pointwise binary cross-entropy on each pair's logit: label 1 for the positive, 0 for each negative
    (sentence-transformers' ``BinaryCrossEntropyLoss``; monoBERT's objective, Nogueira & Cho 2019):

        L = -1/(B(1+k)) sum_ij [ w y_ij log sigma(s_ij) + (1 - y_ij) log(1 - sigma(s_ij)) ]

    ``pos_weight`` w weighs the positives (null: 1); k negatives per positive make k a common choice.
    """

    def __init__(self, *, pos_weight: float | None, max_skipped_steps: int) -> None:
        super().__init__()
        self.pos_weight = None if pos_weight is None else float(pos_weight)
        self.max_skipped_steps = max_skipped_steps

    def forward(self, logits: torch.Tensor) -> LossOutput:
        logits_fp32 = at_least_fp32(logits)
        targets = torch.zeros_like(logits_fp32)
        targets[:, 0] = 1.0
        weight = None if self.pos_weight is None else torch.tensor(self.pos_weight, device=logits.device)
        loss = F.binary_cross_entropy_with_logits(logits_fp32, targets, pos_weight=weight)
        return LossOutput(loss=loss, scores=logits, labels=positive_first_labels(logits))
