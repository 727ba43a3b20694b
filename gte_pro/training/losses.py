"""Contrastive losses over (query, positive[, hard negatives]) embeddings.

Both losses score the *local* queries of this process against the documents (and, for ``gte``, the queries)
of the whole global batch. With ``gather_across_devices`` on under DDP the embeddings of every rank are
collected with an autograd-aware all_gather, whose backward sums the gradients that every rank's loss sends
to an embedding. DDP then averages parameter gradients over N ranks, which makes N ranks x batch B train
exactly like one process with batch N*B (the loss of each rank is a mean over its B local queries).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import nn

from gte_pro.errors import ConfigError
from gte_pro.training.gather import gather_with_grad
from gte_pro.training.partition import Partition, contrastive_cross_entropy
from gte_pro.training.quantization_aware import fit_ranges_buffer, quantized_batch, ranges_for_step


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


def _matryoshka(dims: Sequence[int] | None, weights: Sequence[float] | None) -> tuple[list[int], list[float]]:
    """``loss.matryoshka_dims`` and their weights, 1 each unless given (the config check holds them paired)."""
    if not dims:
        return [], []
    return [int(d) for d in dims], [1.0] * len(dims) if weights is None else [float(w) for w in weights]


@dataclass
class GlobalBatch:
    """One step's embeddings, gathered once: the local rows and, from every rank, the candidate documents
    [all positives; all hard negatives] and (for losses that score them) all queries. Matryoshka truncates this."""

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

    def truncated(self, dim: int) -> GlobalBatch:
        def cut(x: torch.Tensor | None) -> torch.Tensor | None:
            return None if x is None else x[..., :dim]

        return replace(self, query=self.query[..., :dim], positive=self.positive[..., :dim],
                       candidates=self.candidates[..., :dim], queries_all=cut(self.queries_all),
                       negatives=cut(self.negatives))


class ContrastiveLoss(nn.Module, abc.ABC):
    """Shared plumbing: gathering across devices and candidate layout [positives; negatives].

    ``mini_batch_size`` is not used by the loss itself: it tells the training step to compute this loss the cached
    way (``gte_pro.training.gradcache``: embeddings in chunks of that many texts, same loss and gradients). It lives
    here so that ``loss.*`` in the config describes the whole loss computation and ``instantiate(cfg.loss)`` keeps
    working wherever it is called. ``max_skipped_steps`` is read the same way: how many optimizer steps with a
    non-finite loss or gradient norm the training step skips before it stops the run (``gte_pro.training.guard``).

    ``similarity="cosine"`` scores unit vectors whatever the encoder returns: a model whose files carry no
    ``Normalize`` module (``model.normalize`` false) would otherwise train on raw dot products at a temperature
    meant for cosines. ``"dot"`` scores the embeddings as they come.

    ``matryoshka_dims`` (Matryoshka representation learning, as sentence-transformers' ``MatryoshkaLoss``): the loss
    is the ``matryoshka_weights``-weighted sum (weights 1 by default) of the loss on the first d dimensions of every
    embedding, for each d, so that truncated embeddings keep working. The embeddings are gathered across devices
    once, at full width, and truncated after. Subclasses compute one loss in ``_loss``.

    ``false_negative_margin``, ``guide``/``guide_margin`` and ``hardness_alpha`` (``gte_pro.training.partition``):
    what each query's softmax keeps and how it weighs its negatives, applied the same way to every loss's partition
    function (``_partition``). ``guide`` is the guide model's name, read by the training module, which loads it
    (``gte_pro.training.guide``) and hands its embeddings to ``forward``; the loss scores them in its own layout.

    ``quantization_aware`` (``gte_pro.training.quantization_aware``): plus ``quantization_weight`` times ``_loss`` on
    the int8/binary embeddings (straight-through), at full width only; the int8 ranges are the checkpointed buffer
    ``quantization_ranges``, registered only then (other runs' state dicts are unchanged).
    """

    # whether ``_loss`` scores against every rank's queries (one more all_gather per step)
    needs_all_queries = False

    def __init__(self, *, temperature: float = 0.05, gather_across_devices: bool = True,
                 mini_batch_size: int | None = None, max_skipped_steps: int = 10,
                 similarity: str = "cosine", matryoshka_dims: Sequence[int] | None = None,
                 matryoshka_weights: Sequence[float] | None = None, quantization_aware: Sequence[str] = (),
                 quantization_weight: float = 1.0, false_negative_margin: float | None = None,
                 hardness_alpha: float = 0.0, guide: str | None = None, guide_margin: float = 0.0) -> None:
        super().__init__()
        # the values come checked (gte_pro.config.checks, from gte_pro/config/schema/loss.py)
        self.temperature = float(temperature)
        self.gather_across_devices = bool(gather_across_devices)
        self.mini_batch_size = None if mini_batch_size is None else int(mini_batch_size)
        self.max_skipped_steps = int(max_skipped_steps)
        self.similarity = similarity
        self.matryoshka_dims, self.matryoshka_weights = _matryoshka(matryoshka_dims, matryoshka_weights)
        self.quantization_aware = tuple(quantization_aware or ())
        self.quantization_weight = float(quantization_weight)
        # what each row's softmax keeps and how it weighs it: gte_pro.training.partition
        self.false_negative_margin = None if false_negative_margin is None else float(false_negative_margin)
        self.hardness_alpha = float(hardness_alpha)
        self.guide, self.guide_margin = guide, float(guide_margin)
        if self.quantization_aware:  # (2, dim) once the first training batch has been seen
            self.register_buffer("quantization_ranges", torch.empty(2, 0))
            self._register_load_state_dict_pre_hook(fit_ranges_buffer, with_module=True)

    def forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None = None,
                teacher_scores: torch.Tensor | None = None, guide: GuideEmbeddings | None = None) -> LossOutput:
        """``teacher_scores`` (B_local, 1 + k): the batch's teacher scores, read by the distillation losses only;
        ``guide``: the guide's embeddings of the same texts (``loss.guide``), None: no guided masking."""
        out = self._forward(query, positive, negatives, teacher_scores, guide)
        # references to tensors the step holds anyway: the telemetry reads them without another forward pass
        out.query, out.positive = query.detach(), positive.detach()
        return out

    def _forward(self, query: torch.Tensor, positive: torch.Tensor, negatives: torch.Tensor | None,
                 teacher_scores: torch.Tensor | None, guide: GuideEmbeddings | None) -> LossOutput:
        batch = self._gathered(query, positive, negatives)
        batch.negatives, batch.teacher = negatives if batch.num_negatives else None, teacher_scores
        if guide is not None:  # gathered as the student's, scored in the same layout, once for every width
            with torch.no_grad():
                batch.guide_scores = self._partition(self._gathered(*guide))[0]
        out = self._float_loss(batch)
        return self._with_quantized(batch, out) if self.quantization_aware else out

    def _float_loss(self, batch: GlobalBatch) -> LossOutput:
        """The loss on the float embeddings: at the full width, or the weighted sum over the Matryoshka widths."""
        if not self.matryoshka_dims:
            return self._loss(batch)
        full = batch.query.shape[-1]
        if max(self.matryoshka_dims) > full:
            raise ConfigError(f"loss.matryoshka_dims={list(self.matryoshka_dims)}: {max(self.matryoshka_dims)} is "
                             f"larger than the model's embedding dimension {full}")
        outputs = [self._loss(batch.truncated(d)) for d in self.matryoshka_dims]
        loss = sum(w * out.loss for w, out in zip(self.matryoshka_weights, outputs, strict=True))
        widest = outputs[self.matryoshka_dims.index(max(self.matryoshka_dims))]  # scores for the train metrics
        return replace(widest, loss=loss)

    def _with_quantized(self, batch: GlobalBatch, out: LossOutput) -> LossOutput:
        """``out`` plus the weighted loss on each quantized space (a training step moves the int8 ranges first)."""
        ranges = ranges_for_step(self, batch.candidates)
        loss = out.loss + sum(self.quantization_weight * self._quantized_loss(batch, p, ranges).loss
                              for p in self.quantization_aware)
        return replace(out, loss=loss)

    def _quantized_loss(self, batch: GlobalBatch, precision: str, ranges: torch.Tensor) -> LossOutput:
        """``_loss`` on the quantized embeddings, scored by the inner product as ``eval.quantization`` ranks."""
        similarity, self.similarity = self.similarity, "dot"  # the quantized vectors are scored as they are
        try:
            return self._loss(quantized_batch(batch, precision, ranges))
        finally:
            self.similarity = similarity

    @abc.abstractmethod
    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each loss class's own partition function over the gathered batch (at one width): (scores of every term,
        -inf where left out; the column of each row's positive; the query-document scores, for the metrics)."""

    def _loss(self, batch: GlobalBatch) -> LossOutput:
        """The softmax cross-entropy of ``_partition`` (``gte_pro.training.partition``)."""
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

    def _scored(self, *embeddings: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
        """The embeddings in the space they are scored in: unit length for cosine similarity."""
        if self.similarity == "dot":
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


class InfoNCELoss(ContrastiveLoss):
    """Cross-entropy of each query over [all positives + all hard negatives] of the (global) batch."""

    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query, candidates = self._scored(batch.query, batch.candidates)
        scores = query @ candidates.T
        return scores, torch.arange(query.shape[0], device=query.device) + batch.offset, scores


class GTELoss(ContrastiveLoss):
    """The improved contrastive loss of the GTE paper (Li et al., 2023, eq. 3).

    For pair i the partition function is one sum over query->doc s(q_i, d_j), query->query s(q_i, q_j) (j != i),
    doc->query s(q_j, d_i) (j != i) and doc->doc s(d_j, d_i) (j != i) similarities; the numerator is s(q_i, d_i).
    Documents d_j range over all positives and hard negatives of the global batch.

    doc->query leaves out j == i: that term is s(q_i, d_i), the numerator, and counting it a second time (as
    sentence-transformers' MNRL with all four ``directions`` still does) puts a floor of ln 2 under the loss and
    halves the gradient on every negative once the positive dominates. ``mask_own_negatives`` also leaves d_i's
    own hard negatives out of doc->doc (as sentence-transformers' MNRL does): they were mined to look like d_i, so
    that term is often the largest in the partition function. conf/loss/gte.yaml has the measured defaults.
    """

    def __init__(self, *, temperature: float = 0.02, mask_own_negatives: bool = False,
                 gather_across_devices: bool = True, mini_batch_size: int | None = None,
                 max_skipped_steps: int = 10, similarity: str = "cosine",
                 matryoshka_dims: Sequence[int] | None = None,
                 matryoshka_weights: Sequence[float] | None = None, quantization_aware: Sequence[str] = (),
                 quantization_weight: float = 1.0, false_negative_margin: float | None = None,
                 hardness_alpha: float = 0.0, guide: str | None = None, guide_margin: float = 0.0) -> None:
        super().__init__(temperature=temperature, gather_across_devices=gather_across_devices,
                         mini_batch_size=mini_batch_size, max_skipped_steps=max_skipped_steps, similarity=similarity,
                         matryoshka_dims=matryoshka_dims, matryoshka_weights=matryoshka_weights,
                         quantization_aware=quantization_aware, quantization_weight=quantization_weight,
                         false_negative_margin=false_negative_margin, hardness_alpha=hardness_alpha, guide=guide,
                         guide_margin=guide_margin)
        self.mask_own_negatives = mask_own_negatives

    needs_all_queries = True

    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query, positive, candidates, queries_all = self._scored(batch.query, batch.positive, batch.candidates,
                                                                batch.queries_all)
        labels = torch.arange(query.shape[0], device=query.device) + batch.offset
        query_doc = query @ candidates.T
        # self-similarities are constant 1/temperature terms that would swamp the denominator: drop them
        query_query = _mask(query @ queries_all.T, labels[:, None])
        # s(q_j, d_i) for the local positive d_i; j == i is the numerator itself: see the class docstring
        doc_query = _mask(positive @ queries_all.T, labels[:, None])
        doc_doc = _mask(positive @ candidates.T,
                        self._doc_doc_excluded(labels, queries_all.shape[0], batch.num_negatives))
        return torch.cat([query_doc, query_query, doc_query, doc_doc], dim=1), labels, query_doc

    def _doc_doc_excluded(self, labels: torch.Tensor, num_positives: int, k: int) -> torch.Tensor:
        """(B_local, n) candidate columns each local positive d_i is not compared with in doc->doc: itself, and with
        ``mask_own_negatives`` its own hard negatives. Candidates are [every rank's positives; every rank's
        negatives] with each rank's negatives in query order, so the k negatives of global pair g sit at columns
        num_positives + g*k ... num_positives + g*k + k-1."""
        if not (self.mask_own_negatives and k):
            return labels[:, None]
        own = num_positives + labels[:, None] * k + torch.arange(k, device=labels.device)
        return torch.cat([labels[:, None], own], dim=1)


def _mask(scores: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``scores`` with row i's ``columns[i]`` set to -inf (out of the partition function)."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask.scatter_(1, columns, True)
    return scores.masked_fill(mask, float("-inf"))
