"""Quantization-aware training (``loss.quantization_aware``): a wrapper around any contrastive loss that adds the
loss on the int8 and/or binary embeddings that ``eval.quantization`` ranks (``gte_pro.evaluation.quantize``,
sentence-transformers' ``quantize_embeddings``), so that the embedding is trained for the quantized space beside
the float one:

    L = L_float(batch) + quantization_weight * sum_p L_inner(batch quantized to precision p)

``L_float`` is the loss as configured (at every Matryoshka width); ``L_inner`` the loss at full width only.

- The quantized values in the forward pass are exactly ``quantize``'s: ``x > 0`` -> +-1 for binary; for int8
  ``floor((x - min) / step)`` clipped to 0..255, minus 128, with per-dimension [min, max] ranges.
- Gradients pass through the rounding by the straight-through estimator (Bengio, Leonard & Courville 2013,
  "Estimating or Propagating Gradients Through Stochastic Neurons for Conditional Computation", arXiv:1308.3432):
  the backward pass treats ``sign`` and ``floor`` as the identity (for int8: of ``(x - min) / step``).
- The int8 ranges are "fake quantization" ranges as in Jacob et al. 2018 ("Quantization and Training of Neural
  Networks for Efficient Integer-Arithmetic-Only Inference", CVPR, section 3): an exponential moving average of the
  per-dimension min and max of each training batch's documents (positives and hard negatives of the global batch),
  updated by training steps only and kept in the checkpoint. They are exported beside the model
  (``quantization.json``, ``gte_pro.export.quantization``) for quantizing a corpus the same way.
- The scores: the quantized vectors scaled by one detached scalar (binary: 1/sqrt(dim), so that the inner product of
  two +-1 vectors divided by dim lies in [-1, 1] like a cosine; int8: 1 / the batch's mean document norm) and scored
  by the inner product, which ranks as ``eval.quantization`` does (usearch's ``ip`` for int8, Hamming for binary).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import replace

import torch
import torch.distributed as dist

from gte_pro.evaluation.quantize import QUANTIZATIONS
from gte_pro.training.losses.batch import GlobalBatch, LossOutput
from gte_pro.utils.distributed import is_distributed

STEP_FLOOR = 0.1  # in the int8 backward pass, no step counts as smaller than this x the median step
RANGE_MOMENTUM = 0.9  # weight of the previous ranges in the moving average (Jacob et al. 2018 use an EMA too)


def binary_ste(x: torch.Tensor) -> torch.Tensor:
    """+-1 (``x > 0``) in the forward pass, the identity's gradient in the backward pass (Bengio et al. 2013)."""
    x = x.float()
    hard = torch.where(x > 0, 1.0, -1.0)
    return x + (hard - x).detach()


def int8_ste(x: torch.Tensor, ranges: torch.Tensor) -> torch.Tensor:
    """``quantize(x, "int8", ranges)``'s values in the forward pass; the gradient of ``(x - min) / step`` backward."""
    start = ranges[0]
    step = (ranges[1] - start) / 255
    step = torch.where(step == 0, torch.ones_like(step), step)
    hard = torch.floor((x.float() - start) / step).clamp(0, 255) - 128
    # the backward pass divides by the step: a (near) constant dimension (all-MiniLM-L6-v2 has one whose range is
    # ~1e-32) would send an infinite gradient; its step counts as at least a tenth of the median step there
    floor = STEP_FLOOR * step.median().detach()
    scaled = (x.float() - start) / torch.maximum(step, floor) - 128
    return scaled + (hard - scaled).detach()


def batch_ranges(documents: torch.Tensor) -> torch.Tensor:
    """(2, dim) per-dimension min and max of the documents (of every rank under DDP), detached, float32."""
    documents = documents.detach().float()
    low, high = documents.min(0).values, documents.max(0).values
    if is_distributed():  # without loss.gather_across_devices each rank holds its own documents only
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return torch.stack([low, high])


def updated_ranges(running: torch.Tensor, documents: torch.Tensor) -> torch.Tensor:
    """The moving average of the ranges after this batch; the batch's own ranges when ``running`` is empty."""
    current = batch_ranges(documents)
    if running.numel() == 0:
        return current
    return RANGE_MOMENTUM * running.to(current) + (1 - RANGE_MOMENTUM) * current


def ranges_for_step(loss: torch.nn.Module, documents: torch.Tensor) -> torch.Tensor:
    """The int8 ranges this step quantizes with. A training step (grad enabled, ``loss.training``) first moves
    ``loss.quantization_ranges`` by the batch's documents (Jacob et al. 2018: the ranges include the current batch);
    before any training step (validation first), the batch's own ranges."""
    if loss.training and torch.is_grad_enabled():
        loss.quantization_ranges = updated_ranges(loss.quantization_ranges, documents)
    ranges = loss.quantization_ranges if loss.quantization_ranges.numel() else batch_ranges(documents)
    return ranges.float()


def quantized_for_scoring(x: torch.Tensor | None, precision: str, ranges: torch.Tensor,
                          scale: torch.Tensor) -> torch.Tensor | None:
    """``x`` quantized (straight-through) and divided by ``scale``, to be scored by the inner product."""
    if x is None:
        return None
    values = binary_ste(x) if precision == "binary" else int8_ste(x, ranges)
    return values / scale


def score_scale(documents: torch.Tensor, precision: str, ranges: torch.Tensor) -> torch.Tensor:
    """The detached scalar that brings quantized scores near cosine range (see the module docstring)."""
    if precision == "binary":
        return torch.tensor(float(documents.shape[-1]) ** 0.5, device=documents.device)
    norms = int8_ste(documents.detach(), ranges).norm(dim=-1)
    return norms.mean().clamp(min=1.0)


def quantized_batch(batch: GlobalBatch, precision: str, ranges: torch.Tensor) -> GlobalBatch:
    """``batch`` with every embedding quantized and scaled, scored by the inner product as ``eval.quantization``
    ranks."""
    scale = score_scale(batch.candidates, precision, ranges)

    def cut(x: torch.Tensor | None) -> torch.Tensor | None:
        return quantized_for_scoring(x, precision, ranges, scale)

    return dataclasses.replace(batch, query=cut(batch.query), positive=cut(batch.positive),
                               candidates=cut(batch.candidates), queries_all=cut(batch.queries_all),
                               negatives=cut(batch.negatives), scored_as_is=True)


def fit_ranges_buffer(loss: torch.nn.Module, state_dict: dict, prefix: str, *_: object) -> None:
    """A load_state_dict pre-hook: ``loss.quantization_ranges`` takes the checkpoint's shape ((2, 0) before the
    first training step, (2, dim) after), so that a resumed run loads the ranges it saved."""
    saved = state_dict.get(prefix + "quantization_ranges")
    if saved is not None:
        loss.quantization_ranges = torch.empty_like(saved, device=loss.quantization_ranges.device)


class QuantizationAware:
    """``outer`` (the float loss) plus ``weight`` x ``inner`` on each quantized space (module docstring). ``owner``
    is the loss module that holds the checkpointed ``quantization_ranges`` buffer; a training step moves the int8
    ranges first."""

    def __init__(self, owner: torch.nn.Module, outer: Callable[[GlobalBatch], LossOutput],
                 inner: Callable[[GlobalBatch], LossOutput], precisions: Sequence[str], weight: float) -> None:
        self.owner, self.outer, self.inner = owner, outer, inner
        self.precisions, self.weight = tuple(precisions), float(weight)

    def __call__(self, batch: GlobalBatch) -> LossOutput:
        out = self.outer(batch)
        ranges = ranges_for_step(self.owner, batch.candidates)
        loss = out.loss + sum(self.weight * self.inner(quantized_batch(batch, p, ranges)).loss
                              for p in self.precisions)
        return replace(out, loss=loss)


__all__ = ["QUANTIZATIONS", "QuantizationAware", "binary_ste", "fit_ranges_buffer", "int8_ste", "quantized_batch",
           "ranges_for_step", "updated_ranges"]
