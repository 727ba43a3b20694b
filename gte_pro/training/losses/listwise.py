"""Listwise softmax cross-entropy for rerankers (``loss=listwise``).

A reranker (cross-encoder) loss over groups of pair logits: one row's query with its positive, then with each of
its k hard negatives (``GroupCollator``: ``logits`` of shape (B, 1 + k), the positive in column 0). Every group is
scored on its own (no in-batch coupling), so DDP's gradient average over N ranks of B rows each trains exactly like
one process with N*B rows, and gradient accumulation is exact too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gte_pro.errors import ConfigError
from gte_pro.training.losses.batch import LossOutput
from gte_pro.training.losses.partition import at_least_fp32


def positive_first_labels(logits: torch.Tensor) -> torch.Tensor:
    """Each group's label: its positive, column 0."""
    return torch.zeros(logits.shape[0], dtype=torch.long, device=logits.device)


class ListwiseLoss(nn.Module):
    """Listwise softmax cross-entropy over each group (FlagEmbedding's reranker loss, ``train_group_size`` = 1 + k):

        L = -1/B sum_i log( exp(s_i0 / tau) / sum_j exp(s_ij / tau) )

    where s_ij is the cross-encoder's logit for (query i, document j of its group), j = 0 the positive. tau = 1 is
    FlagEmbedding's setting. Nogueira & Cho (2019), "Passage Re-ranking with BERT"; Gao et al. (2021), "Rethink
    Training of BERT Rerankers in Multi-Stage Retrieval Pipeline" (the localised contrastive estimation loss).
    """

    def __init__(self, *, temperature: float, max_skipped_steps: int) -> None:
        super().__init__()
        self.temperature = float(temperature)
        self.max_skipped_steps = max_skipped_steps

    def forward(self, logits: torch.Tensor) -> LossOutput:
        if logits.shape[1] < 2:
            raise ConfigError("loss=listwise needs hard negatives to rank the positive against: set "
                             "data.num_negatives >= 1 (rows with fewer get other rows' positives)")
        labels = positive_first_labels(logits)
        loss = F.cross_entropy(at_least_fp32(logits) / self.temperature, labels)
        return LossOutput(loss=loss, scores=logits, labels=labels)
