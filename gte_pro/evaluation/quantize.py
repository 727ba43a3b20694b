"""Quantized embeddings in evaluation (``eval.quantization``): what cheap vector storage costs in NDCG@10.

The semantics are sentence-transformers' ``quantize_embeddings`` and ``semantic_search_usearch``:

- ``int8``: each dimension's [min, max] over the *corpus* embeddings (the calibration set; queries use the same
  ranges) is cut into 256 buckets, ``floor((x - min) / step)`` clipped to 0..255, minus 128. Scored by the inner
  product of the int8 vectors (usearch's ``ip`` metric for ``i8``).
- ``binary``: one bit per dimension, ``x > 0``. Scored by Hamming distance, here as the inner product of the
  +-1 vectors (``dim - 2 * hamming``: the same ranking).

Under DDP the corpus stays sharded: the int8 ranges are a min/max all-reduce over the ranks' shards.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from gte_pro.errors import ConfigError
from gte_pro.utils.distributed import is_distributed

QUANTIZATIONS = ("int8", "binary")


def int8_ranges(corpus: torch.Tensor) -> torch.Tensor:
    """(2, dim): per-dimension min and max of the corpus embeddings of every rank (float32)."""
    corpus = corpus.float()
    dim = corpus.shape[-1]
    low = corpus.min(0).values if corpus.shape[0] else corpus.new_full((dim,), float("inf"))
    high = corpus.max(0).values if corpus.shape[0] else corpus.new_full((dim,), float("-inf"))
    if is_distributed():
        dist.all_reduce(low, op=dist.ReduceOp.MIN)
        dist.all_reduce(high, op=dist.ReduceOp.MAX)
    return torch.stack([low, high])


def quantize(embeddings: torch.Tensor, precision: str, ranges: torch.Tensor | None = None) -> torch.Tensor:
    """``embeddings`` quantized to ``precision``, as float32 vectors whose inner products give its ranking:
    int8 values (-128..127; ``ranges`` from ``int8_ranges``) or +-1 for binary."""
    embeddings = embeddings.float()
    if precision == "binary":
        return torch.where(embeddings > 0, 1.0, -1.0)
    if precision == "int8":
        if ranges is None:
            raise ValueError("int8 quantization needs the corpus ranges (int8_ranges)")
        start = ranges[0]
        step = (ranges[1] - start) / 255
        step = torch.where(step == 0, torch.ones_like(step), step)
        return torch.floor((embeddings - start) / step).clamp(0, 255) - 128
    raise ConfigError(f"eval.quantization: {precision!r} is not valid; valid choices: {', '.join(QUANTIZATIONS)}")
