"""What the distillation losses share (``distill_kl``, ``margin_mse``): each query's student scores over its own
candidates [positive, k negatives] are fitted to the teacher's scores of the same texts (the data's
``pos_scores``/``neg_scores``, carried on the batch as ``teacher_scores``, see ``gte_pro.data.scores``), optionally
plus ``weight_infonce`` times InfoNCE's in-batch term:

    L = L_distill(student, teacher) + weight_infonce * L_InfoNCE

The distillation term is per query over its own candidates: nothing is gathered for it. The InfoNCE term is
:class:`~gte_pro.training.losses.InfoNCELoss`'s (gathered across devices as configured), and its scores are what the
training metrics (acc, sim_pos, sim_neg) are computed from, with or without its weight. Matryoshka applies to both
terms at each width. GradCache needs nothing more: the loss sees the whole batch's embeddings either way.

Slots without a teacher score (NaN: a missing hard negative filled with another row's positive, a re-mined
negative, a row of an unscored source in data=mix) are left out: of both softmaxes for ``distill_kl``, of the mean
for ``margin_mse``; a query with no scored candidate other than the positive adds nothing to the mean. Under DDP
each rank averages over its own queries and DDP averages the ranks' gradients: with equal batches and every slot
scored that is the mean over the global batch.
"""

from __future__ import annotations

import abc
from dataclasses import replace

import torch

from gte_pro.errors import ConfigError
from gte_pro.training.losses.batch import GlobalBatch, LossOutput
from gte_pro.training.losses.infonce import InfoNCELoss
from gte_pro.training.losses.partition import at_least_fp32


class DistillationLoss(InfoNCELoss):
    """The shared part: the student's own-candidate scores, the teacher's, and the weighted InfoNCE term."""

    name = ""

    def __init__(self, *, weight_infonce: float, allow_weak_teacher: bool, **shared: object) -> None:
        super().__init__(**shared)
        self.weight_infonce = float(weight_infonce)
        # judged before the run starts (gte_pro.config.cross_keys.weak_teacher_problems); kept for the record
        self.allow_weak_teacher = bool(allow_weak_teacher)

    def _loss(self, batch: GlobalBatch) -> LossOutput:
        infonce = super()._loss(batch)
        student, teacher = self.own_scores(batch)
        loss = self.distill(student, teacher)
        if self.weight_infonce:
            loss = loss + self.weight_infonce * infonce.loss
        return replace(infonce, loss=loss)

    def own_scores(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """(student, teacher), each (B_local, 1 + k): each query's scores of its positive, then its k negatives."""
        if batch.teacher is None:
            raise ConfigError(f"loss={self.name} needs teacher scores: give the training rows pos_scores and "
                             "neg_scores (FlagEmbedding's layout, see docs/losses.md)")
        if batch.negatives is None:
            raise ConfigError(f"loss={self.name} needs hard negatives: set data.num_negatives >= 1")
        query, positive, negatives = self._scored(batch, batch.query, batch.positive, batch.negatives)
        student = torch.cat([(query * positive).sum(-1, keepdim=True),
                             torch.einsum("bd,bkd->bk", query, negatives)], dim=1)
        teacher = batch.teacher.to(device=student.device)
        if teacher.shape != student.shape:
            raise ValueError(f"teacher_scores has shape {tuple(teacher.shape)}, expected {tuple(student.shape)} "
                             "(batch size, 1 + num_negatives)")
        return at_least_fp32(student), at_least_fp32(teacher.detach())

    @abc.abstractmethod
    def distill(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """The distillation term from (B_local, 1 + k) student and teacher scores; NaN teacher slots left out."""
