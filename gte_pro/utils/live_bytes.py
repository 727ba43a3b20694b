"""The bytes of every live tensor, and their peak: what a GPU's allocator would count, measured on any device.

``torch.cuda.max_memory_allocated`` has no CPU counterpart (the process's RSS also holds the libraries, the
allocator's free lists and Python). :class:`LiveBytes` is a dispatch mode that sees each tensor an operator returns,
counts its storage once (views share it) until the storage is freed, and keeps the peak; the tensors that existed
before (a model's parameters) are added with :meth:`LiveBytes.add`. It checks the memory estimate
(:mod:`gte_pro.preflight.memory_estimate`) against real training steps on the CPU.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class LiveBytes(TorchDispatchMode):
    """``with LiveBytes() as counter: ...``; then ``counter.live`` and ``counter.peak`` (bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # storage address -> bytes, while the storage lives

    def add(self, tensors: Iterable[torch.Tensor]) -> None:
        for tensor in tensors:
            self._track(tensor)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address == 0 or address in self._sizes or tensor.device.type == "meta":
            return
        self._sizes[address] = storage.nbytes()
        self.live += self._sizes[address]
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, address)

    def _free(self, address: int) -> None:
        self.live -= self._sizes.pop(address, 0)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for leaf in tree_leaves(out):
            if isinstance(leaf, torch.Tensor):
                self._track(leaf)
        return out
