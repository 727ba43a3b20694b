"""Batch order: each rank's share of a seeded, optionally length-grouped shuffle, resumable mid-epoch.

The order of an epoch is a pure function of (seed, epoch): nothing about it lives in a worker process or needs
saving except where in the epoch training stopped. ``ResumableLoader`` reports that position to Lightning's
checkpoint (its ``state_dict``) and hands it back to the sampler on resume, so a killed run continues with exactly
the batches it had not trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, DistributedSampler

from gte_pro.errors import ResumeError

# a sampler item: (row of the training data, epoch). The epoch travels with the row so that the dataset's draw of
# positives and negatives (gte_pro.data.datasets.TokenizedPairs) changes every epoch without any counter in the
# DataLoader's worker processes (which are copies, and restart every epoch unless persistent).
RowKey = tuple[int, int]


def shuffled_batches(rng: np.random.Generator, num_rows: int, global_batch: int, lengths: np.ndarray | None = None,
                     window_batches: int = 50) -> list[np.ndarray]:
    """One shuffled pass over ``num_rows`` rows as full global batches (a partial last one is dropped); with
    ``lengths``, each window of ``window_batches`` batches is sorted by length before the cut and the batches are
    shuffled again."""
    order = rng.permutation(num_rows)
    if lengths is None:
        return [order[i : i + global_batch] for i in range(0, num_rows // global_batch * global_batch, global_batch)]
    span = global_batch * window_batches
    batches = []
    for start in range(0, len(order), span):
        window = order[start : start + span]
        window = window[np.argsort(-lengths[window], kind="stable")]
        batches += [window[i : i + global_batch] for i in range(0, len(window), global_batch)]
    full = [b for b in batches if len(b) == global_batch]
    return [full[i] for i in rng.permutation(len(full))]


class EpochSampler(DistributedSampler):
    """Rank ``rank``'s rows of each global batch of an epoch's shuffled order.

    The epoch's permutation is cut into global batches of ``batch_size x world_size`` rows; with ``lengths`` each
    window of ``window_batches`` global batches is sorted by length before the cut (less padding per step) and the
    epoch's batches are shuffled again, so long and short batches still alternate. Only full global batches are
    used: every step of every rank gets a full contrastive batch. Rank r takes every world_size-th row of each
    global batch (rows of similar length on every rank, so no rank waits for a longer one).

    A ``DistributedSampler`` so that Lightning uses it as it is instead of wrapping it: the sharding is ours and
    the same in one process and in many.
    """

    def __init__(self, num_rows: int, batch_size: int, world_size: int = 1, rank: int = 0, seed: int = 0,
                 lengths: np.ndarray | None = None, window_batches: int = 50) -> None:
        super().__init__(range(num_rows), num_replicas=world_size, rank=rank, shuffle=True, seed=seed,
                         drop_last=True)
        self.num_rows = num_rows
        self.batch_size = batch_size
        self.global_batch = batch_size * world_size
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.window_batches = max(1, window_batches)
        self._resume: tuple[int, int] | None = None  # (epoch, batches of it already trained)

    @property
    def batches_per_epoch(self) -> int:
        return self.num_rows // self.global_batch

    def __len__(self) -> int:
        return self.batches_per_epoch * self.batch_size

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def resume_at(self, epoch: int, batches_done: int) -> None:
        """The next pass over ``epoch`` starts after its first ``batches_done`` batches (a finished epoch: the next
        epoch from its start). Lightning opens the resumed loader before it calls ``set_epoch``, so set it here."""
        if batches_done >= self.batches_per_epoch:
            epoch, batches_done = epoch + 1, 0
        self.epoch = epoch
        self._resume = (epoch, batches_done)

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        """The epoch's full global batches, in training order (the same list on every rank)."""
        return shuffled_batches(np.random.default_rng([self.seed, epoch]), self.num_rows, self.global_batch,
                                self.lengths, self.window_batches)

    def layout(self) -> dict[str, Any]:
        """What the batch order depends on besides the epoch: a checkpoint's position means the same batches only
        under the same layout (``ResumableLoader`` saves it and compares it on resume). JSON-able values."""
        return {"global_batch": self.global_batch, "num_rows": self.num_rows, "seed": self.seed}

    def __iter__(self) -> Iterator[RowKey]:
        epoch, skip = self.epoch, 0
        if self._resume is not None:
            resume_epoch, batches_done = self._resume
            self._resume = None  # one resumed pass; later epochs start from their first batch
            if resume_epoch == epoch:
                skip = batches_done
        for batch in self.global_batches(epoch)[skip:]:
            yield from ((int(row), epoch) for row in batch[self.rank :: self.num_replicas])


class ResumableLoader(DataLoader):
    """A DataLoader whose ``state_dict`` is (epoch, batches handed to the training loop), which Lightning saves
    in every checkpoint and gives back through ``load_state_dict`` before it iterates again.

    Batches are counted where the training loop takes them (after any worker prefetching), so the count is what
    was trained on: Lightning fetches a sized loader's batches one at a time, as the loop needs them.
    """

    def __init__(self, dataset: Any, sampler: EpochSampler, **kwargs: Any) -> None:
        super().__init__(dataset, sampler=sampler, **kwargs)
        self._position = (sampler.epoch, 0)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        sampler: EpochSampler = self.sampler  # type: ignore[assignment]
        epoch = sampler.epoch
        done = sampler._resume[1] if sampler._resume and sampler._resume[0] == epoch else 0
        self._position = (epoch, done)
        for batch in super().__iter__():
            done += 1
            self._position = (epoch, done)
            yield batch

    def state_dict(self) -> dict[str, Any]:
        sampler: EpochSampler = self.sampler  # type: ignore[assignment]
        epoch, done = self._position
        return {"epoch": epoch, "batches_done": done, **sampler.layout()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        sampler: EpochSampler = self.sampler  # type: ignore[assignment]
        layout = sampler.layout()
        saved = {key: state.get(key) for key in layout}
        if saved != layout:
            # another batch layout would make "the next batch" a different set of rows: say so, don't guess
            raise ResumeError(f"the checkpoint's data order {saved} does not match this run's {layout}: resume with "
                             "the same data, data.batch_size x devices and seed, or start a new run folder")
        sampler.resume_at(int(state["epoch"]), int(state["batches_done"]))
        self._position = (sampler.epoch, sampler._resume[1] if sampler._resume else 0)
