"""Batch order of ``data=mix``: which source each batch (or row) comes from, and the sources' rows as one index.

Rows of all sources share one global index: source i's local row r is global row ``offsets[i] + r``, so
``batch["rows"]`` names a row whatever its source (``gte_pro.data.mix.MixedRows`` reads it back). Like
``EpochSampler``, the order of an epoch is a pure function of (seed, epoch), the same on every rank, and each rank
takes every world_size-th row of each global batch; resuming mid-epoch is ``EpochSampler``'s own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from torch.utils.data import Dataset

from gte_pro.data.sampling import EpochSampler, shuffled_batches

if TYPE_CHECKING:  # types only: the sampler imports no more than torch (spawned DDP workers start faster)
    from gte_pro.data.datasets import DrawnRow

_TAG = 0x6D6978  # "mix": the mix's random streams never coincide with EpochSampler's [seed, epoch] stream


def source_probabilities(counts: Sequence[int], weights: Sequence[float] | None, alpha: float) -> np.ndarray:
    """p_i proportional to ``weights[i]``, or (no weights) to n_i ** alpha: 1 proportional to the sizes, 0 uniform,
    0.5 the GTE paper's choice (small sources are seen more often than their size alone would give)."""
    raw = np.asarray(weights if weights is not None else [n**alpha if n else 0.0 for n in counts], dtype=np.float64)
    return raw / raw.sum()


def offsets_of(counts: Sequence[int]) -> np.ndarray:
    """Where each source's rows start in the global index (one more entry: the total)."""
    return np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


class MixSampler(EpochSampler):
    """Rank ``rank``'s rows of each global batch of an epoch of a mix of sources.

    An epoch has ``sum(counts) // global batch`` steps, as one source of all the rows would. With ``same_source``
    each global batch (the local batches of all ranks in one step) comes from one source, drawn with
    ``probabilities``; its rows are the next global batch of that source's stream: shuffled passes over the source
    (length-grouped like ``EpochSampler`` with ``lengths``), a new pass whenever one runs out, so a source drawn
    more often than its size allows is cycled and one drawn less often shows another random part every epoch.
    Without, each row's source is drawn on its own (the counts per batch are multinomial) and each batch takes its
    share of a source from one pass over it; those batches are not length-grouped.

    Every source with a positive probability needs a global batch of rows: then no batch ever holds a row twice.
    """

    def __init__(self, counts: Sequence[int], probabilities: Sequence[float], batch_size: int, world_size: int = 1,
                 rank: int = 0, seed: int = 0, same_source: bool = True,
                 lengths: Sequence[np.ndarray | None] | None = None, window_batches: int = 50) -> None:
        super().__init__(int(sum(counts)), batch_size, world_size, rank, seed, None, window_batches)
        self.counts = [int(n) for n in counts]
        self.probabilities = np.asarray(probabilities, dtype=np.float64)
        if len(self.probabilities) != len(self.counts):
            raise ValueError(f"{len(self.counts)} sources but {len(self.probabilities)} probabilities")
        short = [i for i, n in enumerate(self.counts) if self.probabilities[i] > 0 and n < self.global_batch]
        if short:
            raise ValueError(f"sources {short} have fewer rows than one global batch ({self.global_batch})")
        self.same_source = same_source
        self.source_lengths = list(lengths) if lengths is not None else [None] * len(self.counts)
        self.offsets = offsets_of(self.counts)

    def layout(self) -> dict[str, Any]:
        # another mix (sizes, probabilities, batch rule) orders the same number of rows differently
        return {**super().layout(), "source_rows": list(self.counts),
                "probabilities": [float(p) for p in self.probabilities], "same_source_batches": self.same_source}

    def global_batches(self, epoch: int) -> list[np.ndarray]:
        rng = np.random.default_rng([self.seed, epoch, _TAG])
        if self.same_source:
            return self._same_source_batches(rng, epoch)
        return self._mixed_batches(rng, epoch)

    def _source_rng(self, epoch: int, source: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, _TAG, source + 1])

    def _same_source_batches(self, rng: np.random.Generator, epoch: int) -> list[np.ndarray]:
        picks = rng.choice(len(self.counts), size=self.batches_per_epoch, p=self.probabilities)
        batches: list[np.ndarray] = [np.empty(0, dtype=np.int64)] * self.batches_per_epoch
        for source in np.unique(picks):
            slots = np.flatnonzero(picks == source)
            source_rng, stream = self._source_rng(epoch, int(source)), []
            while len(stream) < len(slots):  # a new pass over the source when it runs out
                stream += shuffled_batches(source_rng, self.counts[source], self.global_batch,
                                           self.source_lengths[source], self.window_batches)
            for slot, rows in zip(slots, stream, strict=False):
                batches[slot] = rows + self.offsets[source]
        return batches

    def _mixed_batches(self, rng: np.random.Generator, epoch: int) -> list[np.ndarray]:
        shares = rng.multinomial(self.global_batch, self.probabilities, size=self.batches_per_epoch)
        rows = np.empty((self.batches_per_epoch, self.global_batch), dtype=np.int64)
        filled = np.zeros(self.batches_per_epoch, dtype=np.int64)
        for source, size in enumerate(self.counts):
            if not self.probabilities[source]:
                continue  # weight 0: validated only
            source_rng = self._source_rng(epoch, source)
            order, used = source_rng.permutation(size), 0
            for step in np.flatnonzero(shares[:, source]):
                take = int(shares[step, source])
                if used + take > size:  # a batch's share comes from one pass: never the same row twice in it
                    order, used = source_rng.permutation(size), 0
                rows[step, filled[step] : filled[step] + take] = order[used : used + take] + self.offsets[source]
                used += take
                filled[step] += take
        # the sources interleaved within each batch, so that every rank's share is a mix too
        return list(rng.permuted(rows, axis=1))


class MixedPairs(Dataset):
    """The sources' training datasets (``TokenizedPairs``) as one, fetched by (global row, epoch) keys; each
    drawn row carries its global row."""

    def __init__(self, parts: Sequence[Any]) -> None:
        self.parts = list(parts)
        self.offsets = offsets_of([len(part) for part in self.parts])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def locate(self, rows: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(source, local row) of each global row."""
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) and (rows.min() < 0 or rows.max() >= len(self)):
            raise IndexError(f"rows outside 0..{len(self) - 1}")
        sources = np.searchsorted(self.offsets, rows, side="right") - 1
        return sources, rows - self.offsets[sources]

    def __getitem__(self, key: int | tuple[int, int]) -> DrawnRow:
        return self.__getitems__([key])[0]

    def __getitems__(self, keys: Sequence[int | tuple[int, int]]) -> list[DrawnRow]:
        pairs = [(key, 0) if isinstance(key, int) else (int(key[0]), int(key[1])) for key in keys]
        sources, local = self.locate([row for row, _ in pairs])
        items: list[DrawnRow | None] = [None] * len(pairs)
        for source in np.unique(sources):
            at = np.flatnonzero(sources == source)
            drawn = self.parts[source].__getitems__([(int(local[i]), pairs[i][1]) for i in at])
            for i, item in zip(at, drawn, strict=True):
                items[i] = item._replace(row=pairs[i][0])
        return items  # type: ignore[return-value]  # every slot filled above

