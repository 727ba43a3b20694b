"""Batch order: length-grouped shuffling (less padding per step, batch order still random)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler


class LengthGroupedSampler(Sampler[int]):
    """A shuffled order in which each run of ``batch_size`` indices holds texts of similar length.

    The epoch's permutation is cut into windows of ``window_batches`` batches; each window is sorted by length and
    cut into batches, and the batches of the whole epoch are shuffled, so that a step's padding shrinks while long
    and short batches still alternate. ``batch_size`` is the global batch (per-device batch x devices): under DDP
    Lightning deals out this order to the ranks in turn (DistributedSamplerWrapper), so one step's global batch is
    one group. Deterministic in (seed, epoch) on every rank; Lightning calls ``set_epoch``.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, window_batches: int = 50, seed: int = 0) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.window_batches = max(1, window_batches)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        span = self.batch_size * self.window_batches
        batches = []
        for start in range(0, len(order), span):
            window = order[start : start + span]
            window = window[np.argsort(-self.lengths[window], kind="stable")]
            batches += [window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size)]
        full = [b for b in batches if len(b) == self.batch_size]
        partial = [b for b in batches if len(b) < self.batch_size]  # at most one: last, dropped by drop_last
        for batch in [full[i] for i in rng.permutation(len(full))] + partial:
            yield from (int(i) for i in batch)
