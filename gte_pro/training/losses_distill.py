"""Distillation from teacher scores: each query's student scores over its own candidates [positive, k negatives]
are fitted to the teacher's scores of the same texts (the data's ``pos_scores``/``neg_scores``, carried on the batch
as ``teacher_scores``, see ``gte_pro.data.scores``), optionally plus ``weight_infonce`` times InfoNCE's in-batch term.

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
from collections.abc import Sequence
from dataclasses import replace

import torch
import torch.nn.functional as F

from gte_pro.errors import ConfigError
from gte_pro.scoring.teacher_file import NO_RECORD_TEMPERATURE
from gte_pro.training.losses import GlobalBatch, InfoNCELoss, LossOutput
from gte_pro.training.partition import at_least_fp32


class _DistillationLoss(InfoNCELoss):
    """The shared part: the student's own-candidate scores, the teacher's, and the weighted InfoNCE term."""

    name = ""

    def __init__(self, *, temperature: float = 0.05, weight_infonce: float = 0.0, gather_across_devices: bool = True,
                 mini_batch_size: int | None = None, max_skipped_steps: int = 10, similarity: str = "cosine",
                 matryoshka_dims: Sequence[int] | None = None,
                 matryoshka_weights: Sequence[float] | None = None, allow_weak_teacher: bool = False,
                 quantization_aware: Sequence[str] = (), quantization_weight: float = 1.0,
                 false_negative_margin: float | None = None, hardness_alpha: float = 0.0, guide: str | None = None,
                 guide_margin: float = 0.0) -> None:
        super().__init__(temperature=temperature, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size, max_skipped_steps=max_skipped_steps, similarity=similarity,
                         matryoshka_dims=matryoshka_dims, matryoshka_weights=matryoshka_weights,
                         quantization_aware=quantization_aware, quantization_weight=quantization_weight,
                         false_negative_margin=false_negative_margin, hardness_alpha=hardness_alpha, guide=guide,
                         guide_margin=guide_margin)
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
        query, positive, negatives = self._scored(batch.query, batch.positive, batch.negatives)
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


class DistillKLLoss(_DistillationLoss):
    """Soft-label cross-entropy from the teacher's distribution over each query's candidates (FlagEmbedding's
    ``kd_loss_type="kl_div"``, ``AbsEmbedderModel.distill_loss``; as in RocketQAv2 / bge-m3 knowledge distillation):

        p_t = softmax(t / teacher_temperature),  log p_s = log_softmax(s / temperature)
        L = - mean_q  sum_j  p_t[q, j] * log p_s[q, j]  (+ weight_infonce * InfoNCE)

    over j in [positive, k negatives] of query q, with s the student's similarity and t the teacher's scores.
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

    def __init__(self, *, temperature: float = 0.02, teacher_temperature: float | str = "auto",
                 weight_infonce: float = 1.0,
                 gather_across_devices: bool = True, mini_batch_size: int | None = None, max_skipped_steps: int = 10,
                 similarity: str = "cosine", matryoshka_dims: Sequence[int] | None = None,
                 matryoshka_weights: Sequence[float] | None = None, allow_weak_teacher: bool = False,
                 quantization_aware: Sequence[str] = (), quantization_weight: float = 1.0,
                 false_negative_margin: float | None = None, hardness_alpha: float = 0.0, guide: str | None = None,
                 guide_margin: float = 0.0) -> None:
        super().__init__(temperature=temperature, weight_infonce=weight_infonce, allow_weak_teacher=allow_weak_teacher,
                         gather_across_devices=gather_across_devices, mini_batch_size=mini_batch_size,
                         max_skipped_steps=max_skipped_steps, similarity=similarity, matryoshka_dims=matryoshka_dims,
                         matryoshka_weights=matryoshka_weights, quantization_aware=quantization_aware,
                         quantization_weight=quantization_weight,
                         false_negative_margin=false_negative_margin, hardness_alpha=hardness_alpha, guide=guide,
                         guide_margin=guide_margin)
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


class MarginMSELoss(_DistillationLoss):
    """Margin MSE (Hofstätter et al., 2020, "Improving Efficient Neural Ranking Models with Cross-Architecture
    Knowledge Distillation"; sentence-transformers' ``MarginMSELoss``):

        L = mean_{q, j} ( (s(q, pos) - s(q, neg_j)) - (t(q, pos) - t(q, neg_j)) )^2  (+ weight_infonce * InfoNCE)

    over each query's k negatives, with s the student's similarity (no temperature: the margins are fitted as they
    are; ``loss.temperature`` only scales the InfoNCE term) and t the teacher's scores. sentence-transformers scores
    with the dot product by default: conf/loss/margin_mse.yaml sets ``similarity: dot`` (the same as cosine for a
    normalising encoder), ``weight_infonce: 0`` (MarginMSE alone).
    """

    name = "margin_mse"

    def __init__(self, *, temperature: float = 0.05, weight_infonce: float = 0.0, gather_across_devices: bool = True,
                 mini_batch_size: int | None = None, max_skipped_steps: int = 10, similarity: str = "dot",
                 matryoshka_dims: Sequence[int] | None = None,
                 matryoshka_weights: Sequence[float] | None = None, allow_weak_teacher: bool = False,
                 quantization_aware: Sequence[str] = (), quantization_weight: float = 1.0,
                 false_negative_margin: float | None = None, hardness_alpha: float = 0.0, guide: str | None = None,
                 guide_margin: float = 0.0) -> None:
        super().__init__(temperature=temperature, weight_infonce=weight_infonce, allow_weak_teacher=allow_weak_teacher,
                         gather_across_devices=gather_across_devices, mini_batch_size=mini_batch_size,
                         max_skipped_steps=max_skipped_steps, similarity=similarity, matryoshka_dims=matryoshka_dims,
                         matryoshka_weights=matryoshka_weights, quantization_aware=quantization_aware,
                         quantization_weight=quantization_weight,
                         false_negative_margin=false_negative_margin, hardness_alpha=hardness_alpha, guide=guide,
                         guide_margin=guide_margin)

    def distill(self, student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        teacher_margin = teacher[:, :1] - teacher[:, 1:]
        scored = torch.isfinite(teacher_margin)
        error = torch.where(scored, student[:, :1] - student[:, 1:] - teacher_margin.nan_to_num(0.0), 0.0)
        return error.pow(2).sum() / scored.sum().clamp(min=1)
