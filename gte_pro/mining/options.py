"""The options of hard-negative mining (``mine.*``, and ``data.remine`` when re-mining during training):
``MiningOptions``, the checks of their values (``option_problems``, named by config key) and building them from a
config node (``mining_options``); the teacher that rescores the window (``mine.rescore_*``: ``RescoreOptions``,
``rescore_options``, ``teacher_margin_problems``). What they mean is ``gte_pro.mining.core``'s docstring and
``gte_pro.mining.rescore``'s."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any

from gte_pro.errors import ConfigError

SAMPLING = ("top", "random")
TEACHER_KINDS = ("cross-encoder", "embedder")


@dataclass(frozen=True)
class MiningOptions:
    num_negatives: int = 15
    range_min: int = 10  # rank window [range_min, range_max): 0-based ranks among the corpus sorted by score,
    range_max: int = 100  # counted after removing the query's own positives (rank 0 = best non-positive)
    sampling: str = "top"  # top: the best survivors of the window; random: uniform among the window's survivors
    relative_margin: float | None = 0.05  # drop a candidate scoring above pos - |pos| * m (= (1 - m) * pos, pos >= 0)
    absolute_margin: float | None = None  # drop a candidate scoring above pos - m
    max_score: float | None = None  # drop a candidate scoring above this
    seed: int = 0
    max_scores_per_chunk: int = 1 << 24  # bounds the (queries x corpus) score block held at once

    def __post_init__(self) -> None:
        check_options(asdict(self))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def option_problems(values: Mapping[str, Any], where: str = "mine") -> list[str]:
    """Every bad value among the MiningOptions keys of ``values``, one line each naming ``<where>.<key>``."""
    def bad(key: str, rule: str) -> str:
        return f"{where}.{key}={values.get(key)!r}: {rule}"

    problems = []
    for key, low in (("num_negatives", 1), ("range_min", 0), ("range_max", 1), ("max_scores_per_chunk", 1),
                     ("seed", 0)):
        if key in values and not (_is_int(values[key]) and values[key] >= low):
            problems.append(bad(key, f"expected an integer >= {low}"))
    for key in ("relative_margin", "absolute_margin", "max_score"):
        value = values.get(key)
        if value is not None and not (_is_number(value) and (key == "max_score" or value >= 0)):
            problems.append(bad(key, "expected a number or null" if key == "max_score" else
                                "expected a number >= 0 or null"))
    if "sampling" in values and values["sampling"] not in SAMPLING:
        problems.append(bad("sampling", f"valid choices: {', '.join(SAMPLING)}"))
    low, high = values.get("range_min"), values.get("range_max")
    if _is_int(low) and _is_int(high) and low >= high:
        problems.append(bad("range_min", f"must be smaller than {where}.range_max={high}"))
    elif _is_int(low) and _is_int(high) and _is_int(values.get("num_negatives")) and (
            values["num_negatives"] > high - low):
        problems.append(bad("num_negatives", f"more than the window holds ({where}.range_max - {where}.range_min = "
                                             f"{high - low})"))
    return problems


def check_options(values: Mapping[str, Any], where: str = "mine") -> None:
    if problems := option_problems(values, where):
        raise ConfigError("invalid mining options:\n  " + "\n  ".join(problems))


def mining_options(cfg_node: Any, seed: int, where: str = "mine") -> MiningOptions:
    """MiningOptions from a config node whose keys are named like the dataclass fields (others are ignored);
    errors name ``<where>.<key>``."""
    names = {f.name for f in fields(MiningOptions)} - {"seed"}
    values = {key: cfg_node[key] for key in names if key in cfg_node}
    values["seed"] = seed
    check_options(values, where)
    return MiningOptions(**values)


# --- the teacher (mine.rescore_with) ------------------------------------------------------------------------------
@dataclass(frozen=True)
class RescoreOptions:
    name_or_path: str  # the teacher: a task=rerank export, a cross-encoder or an embedder (folder or hub name)
    kind: str | None = None  # cross-encoder | embedder; None: the folder's config.json says (load_teacher)
    batch_size: int = 64  # pairs per teacher batch
    max_length: int = 512  # the teacher's truncation (of the joined pair for a cross-encoder)


def rescore_problems(values: Mapping[str, Any], where: str = "mine") -> list[str]:
    """Every bad value among the ``rescore_*`` keys of ``values``, one line each naming ``<where>.<key>``."""
    problems = []
    teacher = values.get("rescore_with")
    if teacher is not None and not (isinstance(teacher, str) and teacher.strip()):
        problems.append(f"{where}.rescore_with={teacher!r}: expected the teacher's folder or hub name (a task=rerank "
                        "export, a cross-encoder or an embedder), or null for no rescoring")
    kind = values.get("rescore_kind")
    if kind is not None and kind not in TEACHER_KINDS:
        problems.append(f"{where}.rescore_kind={kind!r}: valid choices: null (the teacher's config.json says), "
                        f"{', '.join(TEACHER_KINDS)}")
    for key in ("rescore_batch_size", "rescore_max_length"):
        if values.get(key) is not None and not (_is_int(values[key]) and values[key] >= 1):
            problems.append(f"{where}.{key}={values[key]!r}: expected an integer >= 1")
    return problems


def rescore_options(cfg_node: Any, where: str = "mine") -> RescoreOptions | None:
    """The teacher's settings of a config node (``rescore_with``, ``rescore_kind``, ``rescore_batch_size``,
    ``rescore_max_length``), or None when ``rescore_with`` is unset; bad values raise ConfigError."""
    values = {key: cfg_node[key] for key in ("rescore_with", "rescore_kind", "rescore_batch_size",
                                            "rescore_max_length") if key in cfg_node}
    if problems := rescore_problems(values, where):
        raise ConfigError("invalid mining options:\n  " + "\n  ".join(problems))
    if values.get("rescore_with") is None:
        return None
    defaults = RescoreOptions("")
    return RescoreOptions(str(values["rescore_with"]), values.get("rescore_kind"),
                          int(values.get("rescore_batch_size") or defaults.batch_size),
                          int(values.get("rescore_max_length") or defaults.max_length))


def teacher_margin_problems(options: MiningOptions, kind: str, where: str = "mine") -> list[str]:
    """The margins apply to the teacher's scores when it rescores: a relative margin is a fraction of the
    positive's score, which a cross-encoder's logit does not have (no zero point, often negative)."""
    if kind == "cross-encoder" and options.relative_margin is not None:
        return [f"{where}.relative_margin={options.relative_margin}: with {where}.rescore_with the margins apply to "
                "the teacher's scores, and a cross-encoder's are logits, of which a fraction means nothing (a logit "
                f"has no zero point and is often negative): set {where}.relative_margin=null, and give a margin in "
                f"logits with {where}.absolute_margin=<m> (a candidate scoring at or above the positive is dropped "
                "in any case)"]
    return []
