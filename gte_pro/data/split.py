"""The validation split: a stable hash of the query text, so a split never drifts between runs or machines."""

from __future__ import annotations

import hashlib

BUCKETS = 1000


def split_bucket(text: str, buckets: int = BUCKETS) -> int:
    """A stable pseudo-random bucket (same on every machine and Python version, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:4], "big") % buckets


def is_held_out(query: str, val_fraction: float) -> bool:
    """True for the ``val_fraction`` of queries that belong to the validation split."""
    return split_bucket(query) < int(val_fraction * BUCKETS)
