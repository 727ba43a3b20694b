"""Cross-device negatives: every rank's embeddings gathered with a backward that returns each rank the gradients
of its own rows, so that N ranks x batch B train exactly like one process with batch N*B (gte_pro.training.losses)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from gte_pro.utils.distributed import is_distributed


class _GatherRows(torch.autograd.Function):
    """all_gather along dim 0 whose backward hands each rank the sum over ranks of the gradients of its own rows.

    Written here rather than taken from ``torch.distributed.nn``: that one is deprecated, and on gloo its backward
    emulates reduce-scatter with a scatter per rank, which left processes aborting at exit ("terminate called
    without an active exception"). NCCL has reduce-scatter; gloo gets an all_reduce and keeps its slice.
    """

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # noqa: ANN001 - autograd's context
        world = dist.get_world_size()
        out = x.new_empty((world * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        world, rank = dist.get_world_size(), dist.get_rank()
        rows = grad.shape[0] // world
        grad = grad.contiguous()
        if dist.get_backend() == dist.Backend.NCCL:
            mine = grad.new_empty((rows, *grad.shape[1:]))
            dist.reduce_scatter_single(mine, grad)
            return mine
        grad = grad.clone()  # all_reduce works in place; autograd's incoming gradient is not ours to change
        dist.all_reduce(grad)
        return grad[rank * rows:(rank + 1) * rows]


def gather_with_grad(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    """All ranks' ``x`` concatenated along dim 0 (gradients flow back to their owners) and this rank's offset."""
    if not is_distributed():
        return x, 0
    return _GatherRows.apply(x), dist.get_rank() * x.shape[0]
