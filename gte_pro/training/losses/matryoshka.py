"""Matryoshka representation learning (``loss.matryoshka_dims``, ``loss.matryoshka_weights``): a wrapper around
any contrastive loss, so that the first d dimensions of an embedding work on their own.

    L = sum_d w_d * L_inner(the batch's embeddings truncated to their first d dimensions)

for each d of ``matryoshka_dims`` (weights 1 unless given). Kusupati et al. (2022), "Matryoshka Representation
Learning", NeurIPS; sentence-transformers' ``MatryoshkaLoss``. The embeddings are gathered across devices once, at
full width, and truncated after; the training metrics read the widest width's scores.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from gte_pro.errors import ConfigError
from gte_pro.training.losses.batch import GlobalBatch, LossOutput

LossTerm = Callable[[GlobalBatch], LossOutput]


class Matryoshka:
    """``inner`` summed over the Matryoshka widths (module docstring)."""

    def __init__(self, inner: LossTerm, dims: Sequence[int], weights: Sequence[float] | None) -> None:
        self.inner = inner
        # the config check holds dims and weights paired
        self.dims = [int(d) for d in dims]
        self.weights = [1.0] * len(self.dims) if weights is None else [float(w) for w in weights]

    def __call__(self, batch: GlobalBatch) -> LossOutput:
        full = batch.query.shape[-1]
        if max(self.dims) > full:
            raise ConfigError(f"loss.matryoshka_dims={list(self.dims)}: {max(self.dims)} is larger than the model's "
                             f"embedding dimension {full}")
        outputs = [self.inner(batch.truncated(d)) for d in self.dims]
        loss = sum(w * out.loss for w, out in zip(self.weights, outputs, strict=True))
        widest = outputs[self.dims.index(max(self.dims))]  # scores for the train metrics
        return replace(widest, loss=loss)
