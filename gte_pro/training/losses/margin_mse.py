"""Margin MSE (``loss=margin_mse``): Hofstätter et al. (2020), "Improving Efficient Neural Ranking Models with
Cross-Architecture Knowledge Distillation"; sentence-transformers' ``MarginMSELoss``:

    L = mean_{q, j} ( (s(q, pos) - s(q, neg_j)) - (t(q, pos) - t(q, neg_j)) )^2  (+ weight_infonce * InfoNCE)

over each query's k negatives, with s the student's similarity and t the teacher's scores.
"""

from __future__ import annotations

import torch

from gte_pro.training.losses.distillation import DistillationLoss


class MarginMSELoss(DistillationLoss):
    """The margin MSE of the module docstring. No temperature: the margins are fitted as they are
    (``loss.temperature`` only scales the InfoNCE term). sentence-transformers scores with the dot product by
    default: conf/loss/margin_mse.yaml sets ``similarity: dot`` (the same as cosine for a normalising encoder),
    ``weight_infonce: 0`` (MarginMSE alone)."""

    name = "margin_mse"

    def distill(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        teacher_margin = teacher[:, :1] - teacher[:, 1:]
        scored = torch.isfinite(teacher_margin)
        error = torch.where(scored, student[:, :1] - student[:, 1:] - teacher_margin.nan_to_num(0.0), 0.0)
        return error.pow(2).sum() / scored.sum().clamp(min=1)
