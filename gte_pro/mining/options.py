"""The options of hard-negative mining (``mine.*``, and ``data.remine`` when re-mining during training), as the
mining code takes them: ``MiningOptions`` and, for the teacher that rescores the window (``mine.rescore_*``),
``RescoreOptions``. Their keys, defaults, meanings and rules are ``MineSchema``'s (gte_pro/config/schema/mining.py),
checked with the rest of the config before a run starts; these carry the checked values, with no default or check
of their own. What they mean is ``gte_pro.mining.core``'s docstring and ``gte_pro.mining.rescore``'s."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass(frozen=True, kw_only=True)
class MiningOptions:
    num_negatives: int
    range_min: int  # rank window [range_min, range_max): 0-based ranks among the corpus sorted by score,
    range_max: int  # counted after removing the query's own positives (rank 0 = best non-positive)
    sampling: str  # top: the best survivors of the window; random: uniform among the window's survivors
    relative_margin: float | None  # drop a candidate scoring above pos - |pos| * m (= (1 - m) * pos, pos >= 0)
    absolute_margin: float | None  # drop a candidate scoring above pos - m
    max_score: float | None  # drop a candidate scoring above this
    seed: int
    max_scores_per_chunk: int  # bounds the (queries x corpus) score block held at once


def mining_options(cfg_node: Any, seed: int) -> MiningOptions:
    """MiningOptions from a checked config node (``mine``) whose keys are named like the fields (others ignored)."""
    names = {f.name for f in fields(MiningOptions)} - {"seed"}
    return MiningOptions(seed=seed, **{key: cfg_node[key] for key in names})


# --- the teacher (mine.rescore_with) ------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class RescoreOptions:
    name_or_path: str | tuple[str, ...]  # the teacher: a task=rerank export, a cross-encoder or an embedder (folder
    # or hub name), or several (an ensemble)
    kind: str | None  # cross-encoder | embedder; None: the folder's config.json says (load_teacher)
    batch_size: int  # pairs per teacher batch
    max_length: int  # the teacher's truncation (of the joined pair for a cross-encoder)


def rescore_options(cfg_node: Any) -> RescoreOptions | None:
    """The teacher's settings of a checked config node (``mine.rescore_*``), or None when ``rescore_with`` is
    unset."""
    if cfg_node.get("rescore_with") is None:
        return None
    teacher = cfg_node["rescore_with"]
    names = str(teacher) if isinstance(teacher, str) else tuple(map(str, teacher))
    return RescoreOptions(name_or_path=names, kind=cfg_node.get("rescore_kind"),
                          batch_size=int(cfg_node["rescore_batch_size"]),
                          max_length=int(cfg_node["rescore_max_length"]))


def teacher_margin_problems(options: MiningOptions, kind: str, where: str = "mine") -> list[str]:
    """The margins apply to the teacher's scores when it rescores: a relative margin is a fraction of the
    positive's score, which a cross-encoder's logit does not have (no zero point, often negative), nor an
    ensemble's standardised score."""
    if kind in ("cross-encoder", "ensemble") and options.relative_margin is not None:
        scale = "logits" if kind == "cross-encoder" else "averages of standardised scores"
        return [f"{where}.relative_margin={options.relative_margin}: with {where}.rescore_with the margins apply to "
                f"the teacher's scores, and a {kind}'s are {scale}, of which a fraction means nothing (they have "
                f"no zero point and are often negative): set {where}.relative_margin=null, and give a margin in "
                f"their units with {where}.absolute_margin=<m> (a candidate scoring at or above the positive is "
                "dropped in any case)"]
    return []
