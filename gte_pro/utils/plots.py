"""Pictures of runs and sweeps, made from the runs' own logged metrics (the CSV logger's ``metrics.csv``), headless.

- a run: ``<run>/curves.png`` (train loss, learning rate, validation metrics against the optimizer step, and the
  telemetry/* series when logged);
- a sweep: ``<sweep>/report.md`` with ``metric_vs_<key>.png`` for each swept key (the optimised metric against its
  values) and ``curves.png`` (every job's train loss and validation metric overlaid), the best job marked.

A run without the CSV logger (``logger=none``; wandb and tensorboard keep it on beside them) has no curves; the
sweep plots of the metric against the swept keys still come from each job's ``metrics.json``.
"""

from __future__ import annotations

import csv
import logging
import math
import re
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gte_pro.utils.files import write_text_atomic

log = logging.getLogger(__name__)

Curve = list[tuple[int, float]]  # (optimizer step, value)


def read_curves(run_dir: Path) -> dict[str, Curve]:
    """Every logged metric of a run as (step, value) points, sorted by step; a resumed run's later CSV versions
    (one per start) replace the points of the steps they repeat."""
    points: dict[str, dict[int, float]] = {}
    for version in sorted((run_dir / "csv").glob("version_*/metrics.csv"), key=_version_number):
        with version.open(newline="") as file:
            for row in csv.DictReader(file):
                step = _number(row.get("step"))
                if step is None:
                    continue
                for name, text in row.items():
                    value = _number(text)
                    if name not in ("step", "epoch") and value is not None:
                        points.setdefault(name, {})[int(step)] = value
    return {name: sorted(by_step.items()) for name, by_step in points.items()}


def _version_number(path: Path) -> int:
    return int(path.parent.name.removeprefix("version_") or 0)


def _number(text: Any) -> float | None:
    try:
        value = float(text)
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # no display on a cluster node
    from matplotlib import pyplot as plt

    return plt


def _save(plt: Any, figure: Any, path: Path) -> Path:
    from gte_pro.utils.files import write_atomic

    figure.tight_layout()
    try:  # atomic: a full disk or a kill leaves no half a PNG
        return write_atomic(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)


def _learning_rate(curves: dict[str, Curve]) -> tuple[str, Curve] | None:
    names = sorted(name for name in curves if name.startswith("lr-"))
    return (names[0], curves[names[0]]) if names else None


def _validation(curves: dict[str, Curve], metric: str = "ndcg@10") -> dict[str, Curve]:
    return {name: curve for name, curve in curves.items() if name.startswith("val/") and name.endswith("/" + metric)}


# the telemetry panels (gte_pro.training.telemetry): title and the series drawn in it
TELEMETRY_PANELS = (
    ("in-batch false-negative rate", ("telemetry/false_negative_rate",)),
    ("alignment (lower: pairs closer) / uniformity (lower: spread)", ("telemetry/alignment", "telemetry/uniformity")),
    ("agreement with the teacher", ("telemetry/teacher_agreement", "telemetry/teacher_spearman")),
)


def plot_run(run_dir: Path) -> Path | None:
    """``<run>/curves.png``: train loss, learning rate and validation NDCG@10 against the step, and a second row with
    the telemetry/* series when the run logged them; None without a CSV log."""
    curves = read_curves(run_dir)
    if not curves:
        return None
    plt = _pyplot()
    telemetry = any(name.startswith("telemetry/") for name in curves)
    figure, axes = plt.subplots(2 if telemetry else 1, 3, figsize=(15, 8 if telemetry else 4), squeeze=False)
    loss_ax, lr_ax, val_ax = axes[0]
    _line(loss_ax, curves.get("train/loss", []), "train/loss")
    loss_ax.set(title="train loss", xlabel="step")
    lr = _learning_rate(curves)
    if lr:
        _line(lr_ax, lr[1], lr[0])
    lr_ax.set(title="learning rate", xlabel="step")
    for name, curve in _validation(curves).items():
        _line(val_ax, curve, name, marker="o")
    val_ax.set(title="validation NDCG@10", xlabel="step")
    if telemetry:
        for ax, (title, names) in zip(axes[1], TELEMETRY_PANELS, strict=True):
            for name in names:
                _line(ax, curves.get(name, []), name, marker=".")
            ax.set(title=title, xlabel="step")
    for ax in axes.flat:
        if ax.lines:
            ax.legend(fontsize=8)
    return _save(plt, figure, run_dir / "curves.png")


def _line(ax: Any, curve: Curve, label: str, **style: Any) -> None:
    if curve:
        ax.plot([step for step, _ in curve], [value for _, value in curve], label=label, **style)


# --- sweeps --------------------------------------------------------------------------------------------------------
def parse_overrides(overrides: str) -> dict[str, str]:
    """``"model.lr=1e-05 devices=2"`` -> ``{"model.lr": "1e-05", "devices": "2"}`` (a job's command-line overrides)."""
    pairs = (item.split("=", 1) for item in overrides.split() if "=" in item)
    return {key.lstrip("+~"): value for key, value in pairs}


# overrides of a sweep job that belong to the sweep, not to the job: the preset that makes a run a sweep, and
# Hydra's own settings (launcher, sweeper, folders)
SWEEP_ONLY = ("hparams_search", "hydra")


def rerun_command(overrides: Sequence[str]) -> str:
    """``python train.py`` with a sweep job's own overrides (shell-quoted): that job again, as a single run."""
    kept = [o for o in overrides if re.split(r"[=./]", o.lstrip("+~"), maxsplit=1)[0] not in SWEEP_ONLY]
    return " ".join(["python train.py", *map(shlex.quote, kept)])


def _job_overrides(job_dir: Path) -> list[str]:
    """The overrides Hydra recorded for a job (``.hydra/overrides.yaml``: a YAML list of strings)."""
    from omegaconf import OmegaConf

    return [str(item) for item in OmegaConf.load(job_dir / ".hydra" / "overrides.yaml")]


def swept_keys(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The override keys whose value differs between jobs, in the order they first appear."""
    values: dict[str, set[str]] = {}
    for row in rows:
        for key, value in parse_overrides(row.get("overrides", "")).items():
            values.setdefault(key, set()).add(value)
    return [key for key, seen in values.items() if len(seen) > 1]


def plot_sweep(sweep_dir: Path, rows: Sequence[dict[str, Any]], metric: str) -> Path:
    """``report.md`` and its PNGs for a sweep's summary rows (``gte_pro.launch.sweep.summarize_sweep``, best first)."""
    done = [row for row in rows if isinstance(row.get(metric), float)]
    best = done[0] if done else None
    images = [_plot_metric_vs_key(sweep_dir, done, key, metric, best) for key in swept_keys(rows)]
    curves = _plot_sweep_curves(sweep_dir, done, metric, best)
    lines = [f"# Sweep report: {sweep_dir.name}", "",
             f"{len(rows)} jobs, {len(done)} with `{metric}`."]
    if best:
        lines += ["", f"Best: job {best['job']} (`{best['overrides']}`), {metric} = {best[metric]:.4f}.",
                  "", f"Train it alone: `{rerun_command(_job_overrides(sweep_dir / str(best['job'])))}`"]
    lines += ["", "## Jobs", "", (sweep_dir / "summary.md").read_text() if (sweep_dir / "summary.md").is_file()
              else "_no summary_"]
    for image in [*images, curves]:
        if image is not None:
            lines += ["", f"![{image.stem}]({image.name})"]
    report = sweep_dir / "report.md"
    write_text_atomic(report, "\n".join(lines) + "\n")
    return report


def _slug(key: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", key)


def _plot_metric_vs_key(sweep_dir: Path, rows: Sequence[dict[str, Any]], key: str, metric: str,
                        best: dict[str, Any] | None) -> Path | None:
    points = [(parse_overrides(row["overrides"]).get(key), row[metric], row is best) for row in rows]
    points = [(value, score, is_best) for value, score, is_best in points if value is not None]
    if not points:
        return None
    plt = _pyplot()
    figure, ax = plt.subplots(figsize=(6, 4))
    numbers = [_number(value) for value, _, _ in points]
    if all(n is not None for n in numbers):
        xs: list[Any] = numbers
        if min(xs) > 0 and max(xs) / min(xs) >= 10:
            ax.set_xscale("log")
    else:  # categories (model names, loss names, ...) in the order they were swept
        order = list(dict.fromkeys(value for value, _, _ in points))
        xs = [order.index(value) for value, _, _ in points]
        ax.set_xticks(range(len(order)), order, rotation=20)
    ax.scatter(xs, [score for _, score, _ in points], color="tab:blue", label="job")
    for x, (_, score, is_best) in zip(xs, points, strict=True):
        if is_best:
            ax.scatter([x], [score], marker="*", s=250, color="tab:red", label="best", zorder=3)
    ax.set(xlabel=key, ylabel=metric, title=f"{metric} against {key}")
    ax.legend(fontsize=8)
    return _save(plt, figure, sweep_dir / f"metric_vs_{_slug(key)}.png")


def _plot_sweep_curves(sweep_dir: Path, rows: Sequence[dict[str, Any]], metric: str,
                       best: dict[str, Any] | None) -> Path | None:
    jobs = [(row, read_curves(sweep_dir / row["job"])) for row in rows]
    jobs = [(row, curves) for row, curves in jobs if curves]
    if not jobs:
        return None
    plt = _pyplot()
    figure, (loss_ax, val_ax) = plt.subplots(1, 2, figsize=(13, 4.5))
    for row, curves in jobs:
        style = {"linewidth": 3.0, "zorder": 3} if row is best else {"linewidth": 1.0, "alpha": 0.7}
        label = f"{row['job']}: {row['overrides']}" + (" (best)" if row is best else "")
        _line(loss_ax, curves.get("train/loss", []), label, **style)
        _line(val_ax, curves.get(metric, []), label, marker="o", **style)
    loss_ax.set(title="train loss", xlabel="step")
    val_ax.set(title=metric, xlabel="step")
    val_ax.legend(fontsize=7)
    return _save(plt, figure, sweep_dir / "curves.png")


def score_histograms(path: Path, series: Sequence[tuple[Any, str]], xlabel: str,
                     bins: Sequence[float] | int | None = None) -> Path:
    """Density histograms of score arrays on shared bins, each labelled with its count (an empty one is left out:
    density=True would divide by zero), written atomically as a PNG. ``bins``: the edges; None: 50 over the data."""
    import numpy as np

    from gte_pro.utils.files import write_atomic

    plt = _pyplot()
    figure, axes = plt.subplots(figsize=(7, 4))
    present = [(np.asarray(values, dtype=np.float64), label) for values, label in series if len(values)]
    if bins is None:
        bins = np.histogram_bin_edges(np.concatenate([v for v, _ in present]), bins=50) if present else 50
    for values, label in present:
        axes.hist(values, bins=bins, alpha=0.6, density=True, label=f"{label} ({len(values)})")
    axes.set_xlabel(xlabel)
    axes.set_ylabel("density")
    if present:
        axes.legend()
    figure.tight_layout()
    try:
        return write_atomic(path, lambda tmp: figure.savefig(tmp, format="png", dpi=100))
    finally:
        plt.close(figure)


def plot_run_logged(output_dir: Path) -> None:
    """``curves.png`` from the CSV log (``plot_run``); a plotting failure is reported, not allowed to fail a
    finished run; but a full disk is the user's to know, as anywhere else (two lines, exit code 2)."""
    from gte_pro.errors import FULL_DISK

    try:
        path = plot_run(output_dir)
    except OSError as error:
        if error.errno in FULL_DISK:
            raise
        log.error("curves.png not written: %s: %s", type(error).__name__, error)
        return
    except Exception as error:  # noqa: BLE001 - the run's results are saved; the picture is a convenience
        log.error("curves.png not written: %s: %s", type(error).__name__, error)
        return
    if path is not None:
        log.info("training curves: %s", path)
