"""Objects that the code takes filled with the schemas' defaults, for callers without a composed config
(benchmarks, tests): the defaults stay stated once, in gte_pro/config/schema/."""

from __future__ import annotations

from dataclasses import MISSING, fields
from typing import Any

from hydra.utils import get_class

from gte_pro.config.schema import SCHEMAS
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


def default_loss(option: str | type, **keys: Any) -> Any:
    """``loss=<option>`` (or the loss class a ``conf/loss`` option targets) built with its schema's defaults, then
    ``keys`` (what ``instantiate(cfg.loss)`` builds in a run), e.g.
    ``default_loss("infonce", temperature=0.1, gather_across_devices=False)``."""
    if isinstance(option, type):
        option = next(name for name, schema in SCHEMAS["loss"].items()
                      if schema._target_ == f"{option.__module__.rpartition('.')[0]}.{option.__name__}")
    schema = SCHEMAS["loss"][option]
    values = {item.name: item.default if item.default is not MISSING else item.default_factory()
              for item in fields(schema) if item.name != "_target_"}
    return get_class(schema._target_)(**{**values, **keys})
