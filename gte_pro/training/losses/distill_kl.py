"""Soft-label distillation from the teacher's distribution over each query's candidates (``loss=distill_kl``):

    p_t = softmax(t / teacher_temperature),  log p_s = log_softmax(s / temperature)
    L = - mean_q  sum_j  p_t[q, j] * log p_s[q, j]  (+ weight_infonce * InfoNCE)

over j in [positive, k negatives] of query q, with s the student's similarity and t the teacher's scores.
FlagEmbedding's ``kd_loss_type="kl_div"`` (``AbsEmbedderModel.distill_loss``); as in RocketQAv2 (Ren et al. 2021,
"RocketQAv2: A Joint Training Method for Dense Passage Retrieval and Passage Re-ranking") and bge-m3 (Chen et al.
2024, "BGE M3-Embedding") knowledge distillation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gte_pro.scoring.teacher_file import NO_RECORD_TEMPERATURE
from gte_pro.training.losses.distillation import DistillationLoss


class DistillKLLoss(DistillationLoss):
    """The soft-label cross-entropy of the module docstring.

    ``teacher_temperature=auto`` (the default) reads the teacher's scores at the temperature of its kind, from the
    training file's teacher record (``gte_pro.scoring.teacher_file``: an embedder's cosines at 0.05, a
    cross-encoder's logits at 1): cosines read at 1 give a near-uniform target, which teaches the student not to
    separate positives from negatives.
    FlagEmbedding computes exactly this cross-entropy (not ``F.kl_div``): it is KL(p_t || p_s) plus the teacher's
    entropy, a constant of the data, so the gradients are those of the KL. FlagEmbedding softmaxes the raw teacher
    scores (``teacher_temperature`` 1: auto's value for a cross-encoder's logits) and adds its in-batch cross-entropy
    with weight 1: conf/loss/distill_kl.yaml's defaults (temperature 0.02, FlagEmbedding's default too).
    """

    name = "distill_kl"

    def __init__(self, *, teacher_temperature: float | str, **shared: object) -> None:
        super().__init__(**shared)
        # a run resolves auto from the training file's teacher record (gte_pro.scoring.teacher_file, through
        # gte_pro.modes.build.module_config) before it builds the loss; built without a run, auto is that of a file
        # without a record
        auto = teacher_temperature == "auto"
        self.teacher_temperature = NO_RECORD_TEMPERATURE if auto else float(teacher_temperature)

    def distill(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        scored = torch.isfinite(teacher)
        has_teacher = scored.any(dim=1)
        # a query with no teacher score at all keeps every slot (finite numbers, weighted 0 below): an all -inf row
        # would make NaN gradients even where its weight is 0
        kept = scored | ~has_teacher[:, None]
        log_student = F.log_softmax((student / self.temperature).masked_fill(~kept, float("-inf")), dim=1)
        targets = F.softmax(torch.where(scored, teacher / self.teacher_temperature, 0.0)
                            .masked_fill(~kept, float("-inf")), dim=1)
        per_query = -(targets * log_student.masked_fill(~kept, 0.0)).sum(dim=1)
        weights = has_teacher.to(per_query.dtype)
        return (per_query * weights).sum() / weights.sum().clamp(min=1)
