"""Objects that the code takes filled with the schemas' defaults, for callers without a composed config
(benchmarks, tests): the defaults stay stated once, in gte_pro/config/schema/."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from gte_pro.config.schema.mining import MineSchema
from gte_pro.mining.options import MiningOptions


def default_mining_options(*window: int, seed: int = 0, **overrides: Any) -> MiningOptions:
    """MiningOptions of MineSchema's defaults; ``window``: (num_negatives, range_min, range_max), as far as given;
    ``overrides``: any other field."""
    defaults = {item.name: item.default for item in fields(MineSchema)}
    values = {name: defaults[name] for name in ("num_negatives", "range_min", "range_max", "sampling",
                                                "relative_margin", "absolute_margin", "max_score",
                                                "max_scores_per_chunk")}
    values.update(zip(("num_negatives", "range_min", "range_max"), window, strict=False))
    return MiningOptions(**{**values, "seed": seed, **overrides})
