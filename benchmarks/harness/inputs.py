"""Inputs several benchmarks measure on: the demo corpus (as the default training config cleans and splits it) and
synthetic words for corpora of any size."""

from __future__ import annotations

import random
from typing import Any


def demo_splits(cache_dir: str) -> Any:
    """The demo corpus's splits: ``.train`` (query -> docstring pairs, in file order), ``.distractors``."""
    from gte_pro.data.demo import load_demo_splits

    return load_demo_splits(cache_dir, val_fraction=0.1, min_query_chars=10, min_doc_chars=40, max_distractors=1000)


def words(rng: random.Random, count: int) -> list[str]:
    """``count`` made-up words of 1-4 syllables (a vocabulary for synthetic queries and documents)."""
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "di", "an", "po", "ix", "ne", "ul", "ter", "gra"]
    return ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(count)]
