"""The validation split: a stable hash of the query text, so a split never drifts between runs or machines."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator

from gte_pro.data.records import Example

BUCKETS = 1000


def split_bucket(text: str, buckets: int = BUCKETS) -> int:
    """A stable pseudo-random bucket (same on every machine and Python version, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:4], "big") % buckets


def is_held_out(query: str, val_fraction: float) -> bool:
    """True for the ``val_fraction`` of queries that belong to the validation split."""
    return split_bucket(query) < int(val_fraction * BUCKETS)


def training_stream(rows: Iterable[Example], held_out: list[Example] | None, val_fraction: float,
                    max_train_rows: int | None) -> Iterator[Example]:
    """Training rows as they stream by; with ``held_out``, queries in the validation buckets go there instead
    (a stable hash of the query, so the split never drifts between runs or machines)."""
    taken = 0
    for example in rows:
        if held_out is not None and is_held_out(example.query, val_fraction):
            held_out.append(example)
            continue
        if max_train_rows and taken >= max_train_rows:
            if held_out is None:
                break
            continue  # keep reading: later rows may still be validation rows
        taken += 1
        yield example
