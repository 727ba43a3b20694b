"""A rank's validation outputs (signed ids and embeddings), written into one preallocated tensor each.

Appending each batch's small embedding tensor to a list leaves those tensors between the freed activations of the
batches that follow, and glibc's heap cannot hand that memory back: on a 100k-document corpus the list cost
~350 MB for 26 MB of embeddings. One buffer, sized from the rank's sampler, costs what the embeddings weigh.
"""

from __future__ import annotations

import torch


class ValidationRows:
    """Rows appended batch by batch into buffers of ``capacity`` rows (grown by doubling if that was short)."""

    def __init__(self, capacity: int, dim: int, device: torch.device) -> None:
        self.ids = torch.empty(capacity, dtype=torch.long, device=device)
        self.embeddings = torch.empty(capacity, dim, device=device)
        self.count = 0

    def append(self, ids: torch.Tensor, embeddings: torch.Tensor) -> None:
        end = self.count + len(ids)
        if end > len(self.ids):
            self._grow(max(end, 2 * len(self.ids)))
        self.ids[self.count : end] = ids
        self.embeddings[self.count : end] = embeddings
        self.count = end

    def _grow(self, capacity: int) -> None:
        ids, embeddings = self.ids, self.embeddings
        self.ids = torch.empty(capacity, dtype=ids.dtype, device=ids.device)
        self.embeddings = torch.empty(capacity, embeddings.shape[1], device=embeddings.device)
        self.ids[: self.count], self.embeddings[: self.count] = ids[: self.count], embeddings[: self.count]

    def filled(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.ids[: self.count], self.embeddings[: self.count]
