"""The re-mined hard negatives of a run: one memory-mapped pool per re-mine, read by the training dataset.

A pool is ``<run dir>/negatives/epoch-NNNN.npy``: an int32 array (training rows, k, 2) whose entry [row, i] is the
(row, positive index) of the token cache where the row's i-th mined negative lives, best first, (-1, -1) where fewer
survived the filters. Negatives are stored as references into the memory-mapped token cache, so a pool costs 8 bytes
a negative and a training step reads the negatives' token ids from the cache like everything else. The pool of
epoch E is active from epoch E until the next one; its ``.json`` (written after the array, both atomically) marks
it complete. The pools live in the run folder, not in the shared token cache: they belong to one run's weights.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import numpy as np

from gte_pro.errors import DataError
from gte_pro.utils.files import write_atomic, write_json_atomic

log = logging.getLogger(__name__)


def _array_path(folder: Path, epoch: int) -> Path:
    return folder / f"epoch-{epoch:04d}.npy"


def _meta_path(folder: Path, epoch: int) -> Path:
    return folder / f"epoch-{epoch:04d}.json"


def write_pool(folder: Path, epoch: int, refs: np.ndarray, meta: dict[str, Any]) -> Path:
    """Write the pool of ``epoch`` (array first, then the metadata that marks it complete); its array's path."""
    refs = np.ascontiguousarray(refs, dtype=np.int32)
    if refs.ndim != 3 or refs.shape[2] != 2:
        raise ValueError(f"a negative pool is (rows, k, 2) references, got shape {refs.shape}")

    def fill(tmp: Path) -> None:
        with open(tmp, "wb") as handle:  # a file object: np.save would append .npy to a bare temporary name
            np.save(handle, refs)

    path = write_atomic(_array_path(folder, epoch), fill)
    write_json_atomic(_meta_path(folder, epoch), {**meta, "epoch": epoch, "rows": refs.shape[0], "k": refs.shape[1]})
    return path


class NegativePool:
    """The pools of one run folder, as the training dataset sees them: which is active for an epoch, and a row's
    negatives in it. Picklable (DataLoader workers get a copy that opens the memory maps itself)."""

    def __init__(self, folder: str | Path, negatives_per_row: int) -> None:
        self.folder = Path(folder)
        self.negatives_per_row = negatives_per_row  # what each re-mine finds per row at most (mine.num_negatives)
        self._active: dict[int, int | None] = {}  # epoch -> epoch of its pool, looked up once per epoch
        self._arrays: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict[str, Any]:
        # memory maps are reopened where used
        return {"folder": self.folder, "negatives_per_row": self.negatives_per_row, "_active": {}, "_arrays": {}}

    def epochs(self) -> list[int]:
        """Epochs with a complete pool, ascending."""
        found = []
        for meta in self.folder.glob("epoch-*.json"):
            epoch = int(meta.stem.split("-")[1])
            if _array_path(self.folder, epoch).is_file():
                found.append(epoch)
        return sorted(found)

    def has(self, epoch: int) -> bool:
        return _meta_path(self.folder, epoch).is_file() and _array_path(self.folder, epoch).is_file()

    def refresh(self) -> None:
        """Forget what was looked up: a pool was added or removed."""
        self._active, self._arrays = {}, {}

    def active_epoch(self, epoch: int) -> int | None:
        """The epoch of the pool that training in ``epoch`` draws from (None: the rows' own negatives)."""
        if epoch not in self._active:  # new pools appear only between epochs: one listing per epoch is enough
            self._active[epoch] = max((e for e in self.epochs() if e <= epoch), default=None)
        return self._active[epoch]

    def references(self, rows: list[int], epoch: int) -> list[list[tuple[int, int]]] | None:
        """Each row's mined negatives as (row, positive index) references, or None while no pool is active."""
        active = self.active_epoch(epoch)
        if active is None:
            return None
        if active not in self._arrays:
            self._arrays[active] = np.load(_array_path(self.folder, active), mmap_mode="r")
        block = np.asarray(self._arrays[active][rows])
        return [[(int(r), int(j)) for r, j in row if r >= 0] for row in block]

    def meta(self, epoch: int) -> dict[str, Any]:
        return json.loads(_meta_path(self.folder, epoch).read_text(encoding="utf-8"))

    def check(self, num_rows: int, dim: int) -> None:
        """Every pool must belong to this data and this model; a stale one is an error naming its file."""
        for epoch in self.epochs():
            meta = self.meta(epoch)
            if meta.get("rows") != num_rows:
                raise DataError(f"{_meta_path(self.folder, epoch)}: a negative pool for {meta.get('rows')} training "
                                f"rows, but the training data has {num_rows}: remove {self.folder} or use a new run "
                                "folder")
            if meta.get("dim") != dim:
                raise DataError(f"{_meta_path(self.folder, epoch)}: a negative pool mined with {meta.get('dim')}-"
                                f"dimensional embeddings, but the model's are {dim}-dimensional: remove "
                                f"{self.folder} or use a new run folder")

    def discard_after(self, epoch: int) -> list[int]:
        """Remove the pools of epochs after ``epoch`` (left by a run killed after its checkpoint); their epochs."""
        removed = [e for e in self.epochs() if e > epoch]
        for e in removed:
            _meta_path(self.folder, e).unlink(missing_ok=True)  # the marker first: a half-removed pool is not used
            _array_path(self.folder, e).unlink(missing_ok=True)
        self.refresh()
        return removed
