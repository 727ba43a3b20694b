"""Readable retrieval results: flat logged metrics -> one row per evaluation set, as a markdown table."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from gte_pro.errors import ConfigError
from gte_pro.utils.tables import markdown_table

METRICS = ("ndcg@10", "mrr@10", "map@100", "recall@1", "recall@10", "recall@100")
log = logging.getLogger(__name__)
HELD_OUT = "held-out"  # the row of the training data's own validation split (logged as val/<metric>)


def merge_results(results: Sequence[Mapping[str, Any]] | None) -> dict[str, float]:
    """One flat dict from Lightning's per-dataloader results (the held-out split, then each eval.beir set)."""
    return {key: float(value) for result in results or [] for key, value in result.items()}


def optimized_value(metrics: Mapping[str, float], metric: str | None) -> float | None:
    """``metrics[metric]``, the value a sweep optimises (``optimized_metric``; None: nothing to return). A name
    that this run's validation does not log is an error naming the ones it does, not a silent None."""
    if not metric:
        return None
    if metric not in metrics:
        raise ConfigError(f"optimized_metric={metric!r} is not a metric of this run; valid choices: "
                         f"{', '.join(sorted(metrics))}")
    return float(metrics[metric])


def below_val_before(before: Mapping[str, float] | None, after: Mapping[str, float], metric: str | None,
                     distill_loss: str | None = None) -> dict[str, Any] | None:
    """When the trained model scores below the untrained one on ``metric`` (``optimized_metric``): the figures and
    a note, logged as a warning (metrics.json's ``below_val_before`` and the final table say it too). A student
    distilled (``distill_loss``) that falls below its start learned the ranking of a teacher worse than it was
    (docs/teachers.md). None otherwise."""
    if not before or not metric or metric not in before or metric not in after or after[metric] >= before[metric]:
        return None
    note = f"{metric} {after[metric]:.4f} after training is below {before[metric]:.4f} before it (val_before)"
    if distill_loss:
        note += (f": loss={distill_loss} distilled a teacher that ranks worse than the student started; see the "
                 "training file's teacher record (<train_file>.teacher.json) and docs/teachers.md")
    log.warning("the trained model is worse than the untrained one: %s", note)
    return {"metric": metric, "before": before[metric], "after": after[metric], "loss": distill_loss, "note": note}


def metrics_by_set(flat: Mapping[str, float] | None, prefix: str = "val/") -> dict[str, dict[str, float]]:
    """``{"val/ndcg@10": a, "val/scifact/ndcg@10": b}`` -> ``{"held-out": {"ndcg@10": a}, "scifact": {...}}``."""
    by_set: dict[str, dict[str, float]] = {}
    for key, value in (flat or {}).items():
        if not key.startswith(prefix):
            continue
        name, _, metric = key[len(prefix):].rpartition("/")
        by_set.setdefault(name or HELD_OUT, {})[metric] = float(value)
    # the held-out split first, then the named sets in the order they were logged
    return dict(sorted(by_set.items(), key=lambda item: item[0] != HELD_OUT))


def metrics_table(after: Mapping[str, float] | None, before: Mapping[str, float] | None = None,
                  sizes: Mapping[str, tuple[int, int]] | None = None) -> str:
    """A markdown table: one row per set, a column per metric (and NDCG@10 before training, when given)."""
    rows, old = metrics_by_set(after), metrics_by_set(before)
    if not rows:
        return "_no retrieval metrics_\n"
    columns = ["set"] + (["queries", "docs"] if sizes else []) + ["ndcg@10"]
    columns += ["ndcg@10 before"] if old else []
    columns += [m for m in METRICS if m != "ndcg@10"]
    # eval.quantization: NDCG@10 of the quantized embeddings (ndcg@10_int8, ...), in the order they were logged
    quantized = list(dict.fromkeys(m for values in rows.values() for m in values if m.startswith("ndcg@10_")))
    columns += quantized
    table = []
    for name, values in rows.items():
        cells: list[Any] = [name] + (list(sizes.get(name, (None, None))) if sizes else [])
        cells.append(values.get("ndcg@10"))
        cells += [old.get(name, {}).get("ndcg@10")] if old else []
        cells += [values.get(m) for m in METRICS if m != "ndcg@10"]
        cells += [values.get(m) for m in quantized]
        table.append(cells)
    return markdown_table(columns, table, numeric=[False] + [True] * (len(columns) - 1))
