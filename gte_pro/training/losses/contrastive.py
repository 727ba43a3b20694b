"""What every contrastive loss shares: gathering across devices, the candidate layout [positives; negatives], the
space embeddings are scored in, the options of the partition function, and the wrappers a config composes.

Each loss scores the *local* queries of this process against the documents (and, for ``gte``, the queries) of the
whole global batch. With ``gather_across_devices`` on under DDP the embeddings of every rank are collected with an
autograd-aware all_gather, whose backward sums the gradients that every rank's loss sends to an embedding. DDP then
averages parameter gradients over N ranks, which makes N ranks x batch B train exactly like one process with batch
N*B (the loss of each rank is a mean over its B local queries).

A loss class says only what is its own: its partition function (``_partition``: InfoNCE, GTE) or its whole term
(``_loss``: the distillation losses) and the parameters that belong to it. Around it, in this order:

- ``matryoshka_dims``/``matryoshka_weights`` (``gte_pro.training.losses.matryoshka``) sum it over truncated widths;
- ``quantization_aware``/``quantization_weight`` (``gte_pro.training.losses.quantization_aware``) add it on the
  int8/binary embeddings, at full width only; the int8 ranges are the checkpointed buffer ``quantization_ranges``
  of this module, registered only then (other runs' state dicts are unchanged);
- ``false_negative_margin``, ``guide``/``guide_margin`` and ``hardness_alpha`` (``gte_pro.training.losses.partition``)
  decide what each query's softmax keeps and how it weighs its negatives, the same way for every loss. ``guide`` is
  the guide model's name, read by the training module, which loads it (``gte_pro.training.guide``) and hands its
  embeddings to ``forward``; the loss scores them in its own layout.

``similarity="cosine"`` scores unit vectors whatever the encoder returns: a model whose files carry no ``Normalize``
module (``model.normalize`` false) would otherwise train on raw dot products at a temperature meant for cosines.
``"dot"`` scores the embeddings as they come.

``mini_batch_size`` is not used by the loss itself: it tells the training step to compute this loss the cached way
(``gte_pro.training.gradcache``: embeddings in chunks of that many texts, same loss and gradients). It lives here so
that ``loss.*`` in the config describes the whole loss computation and ``instantiate(cfg.loss)`` keeps working
wherever it is called. ``max_skipped_steps`` is read the same way: how many optimizer steps with a non-finite loss or
gradient norm the training step skips before it stops the run (``gte_pro.training.guard``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from gte_pro.training.gather import gather_with_grad
from gte_pro.training.losses.batch import GlobalBatch, GuideEmbeddings, LossOutput
from gte_pro.training.losses.matryoshka import LossTerm, Matryoshka
from gte_pro.training.losses.partition import Partition, contrastive_cross_entropy
from gte_pro.training.losses.quantization_aware import QuantizationAware, fit_ranges_buffer


class ContrastiveLoss(nn.Module, abc.ABC):
    """The shared plumbing (module docstring). The values come checked (gte_pro.config.checks, from
    gte_pro/config/schema/loss.py)."""

    # whether ``_partition`` scores against every rank's queries (one more all_gather per step)
    needs_all_queries = False

    def __init__(self, *, temperature: float, gather_across_devices: bool, mini_batch_size: int | None,
                 max_skipped_steps: int, similarity: str, matryoshka_dims: Sequence[int] | None,
                 matryoshka_weights: Sequence[float] | None, quantization_aware: Sequence[str],
                 quantization_weight: float, false_negative_margin: float | None, hardness_alpha: float,
                 guide: str | None, guide_margin: float) -> None:
        super().__init__()
        self.temperature = float(temperature)
        self.gather_across_devices = bool(gather_across_devices)
        self.mini_batch_size = None if mini_batch_size is None else int(mini_batch_size)
        self.max_skipped_steps = int(max_skipped_steps)
        self.similarity = similarity
        # what each row's softmax keeps and how it weighs it: gte_pro.training.losses.partition
        self.false_negative_margin = None if false_negative_margin is None else float(false_negative_margin)
        self.hardness_alpha = float(hardness_alpha)
        self.guide, self.guide_margin = guide, float(guide_margin)
        self.quantization_aware = tuple(quantization_aware or ())
        self.objective = self._composed(matryoshka_dims, matryoshka_weights, float(quantization_weight))

    def _composed(self, matryoshka_dims: Sequence[int] | None, matryoshka_weights: Sequence[float] | None,
                  quantization_weight: float) -> LossTerm:
        """This loss's term inside the wrappers the config asks for (module docstring)."""
        objective: LossTerm = self._loss
        if matryoshka_dims:
            objective = Matryoshka(objective, matryoshka_dims, matryoshka_weights)
        if self.quantization_aware:  # (2, dim) once the first training batch has been seen
            self.register_buffer("quantization_ranges", torch.empty(2, 0))
            self._register_load_state_dict_pre_hook(fit_ranges_buffer, with_module=True)
            objective = QuantizationAware(self, objective, self._loss, self.quantization_aware, quantization_weight)
        return objective

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None,
                teacher_scores: torch.Tensor | None = None, guide: GuideEmbeddings | None = None) -> LossOutput:
        """``teacher_scores`` (B_local, 1 + k): the batch's teacher scores, read by the distillation losses only;
        ``guide``: the guide's embeddings of the same texts (``loss.guide``), None: no guided masking."""
        batch = self._gathered(query, positive, negatives)
        batch.negatives, batch.teacher = negatives if batch.num_negatives else None, teacher_scores
        if guide is not None:  # gathered as the student's, scored in the same layout, once for every width
            with torch.no_grad():
                batch.guide_scores = self._partition(self._gathered(*guide))[0]
        out = self.objective(batch)
        # references to tensors the step holds anyway: the telemetry reads them without another forward pass
        out.query, out.positive = query.detach(), positive.detach()
        return out

    @abc.abstractmethod
    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each loss class's own partition function over the gathered batch (at one width): (scores of every term,
        -inf where left out; the column of each row's positive; the query-document scores, for the metrics)."""

    def _loss(self, batch: GlobalBatch) -> LossOutput:
        """The softmax cross-entropy of ``_partition`` (``gte_pro.training.losses.partition``)."""
        scores, labels, query_doc = self._partition(batch)
        out = self._cross_entropy(scores, labels, batch.guide_scores)
        return LossOutput(out.loss, query_doc.detach(), labels, masked_share=out.masked_share,
                          guide_masked_share=out.guide_masked_share)

    def _cross_entropy(self, scores: torch.Tensor, labels: torch.Tensor,
                       guide_scores: torch.Tensor | None = None) -> Partition:
        """Each row's softmax cross-entropy at ``labels`` with this loss's temperature, false-negative margin, guide
        masking and hardness weighting."""
        return contrastive_cross_entropy(scores, labels, self.temperature, self.false_negative_margin,
                                         self.hardness_alpha, guide_scores, self.guide_margin)

    def _scored(self, batch: GlobalBatch, *embeddings: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The embeddings in the space ``batch`` is scored in: unit length for cosine similarity; as they are for
        the dot product and for quantized embeddings."""
        if self.similarity == "dot" or batch.scored_as_is:
            return embeddings
        return tuple(None if x is None else F.normalize(x, dim=-1) for x in embeddings)

    def _gather(self, x: torch.Tensor) -> tuple[torch.Tensor, int]:
        return gather_with_grad(x) if self.gather_across_devices else (x, 0)

    def _gathered(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None) -> GlobalBatch:
        """Global candidate documents: every rank's positives first, then every rank's hard negatives."""
        candidates, offset = self._gather(positive)
        k = negatives.shape[1] if negatives is not None and negatives.numel() else 0
        if k:
            negatives_all, _ = self._gather(negatives.reshape(-1, negatives.shape[-1]))
            candidates = torch.cat([candidates, negatives_all], dim=0)
        queries_all = self._gather(query)[0] if self.needs_all_queries else None
        return GlobalBatch(query, positive, candidates, queries_all, offset, k)
