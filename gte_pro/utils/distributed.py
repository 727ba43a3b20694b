""""Are we distributed?": the one place that asks ``torch.distributed`` which rank this is and how many there are.

No process group (a single process, or before Lightning sets one up) reads as rank 0 of 1, so callers write their
collectives once and skip them when alone.
"""

from __future__ import annotations

import torch.distributed as dist


def world() -> tuple[int, int]:
    """(this process's rank, the number of ranks); (0, 1) without a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_distributed() -> bool:
    """Whether other ranks take part: a collective is needed (a process group of one needs none)."""
    return world()[1] > 1
