"""After a multirun: one row per job (its overrides and final metrics), best first, in summary.csv and .md."""

from __future__ import annotations

import csv
import io
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gte_pro.utils.files import write_text_atomic
from gte_pro.utils.tables import markdown_table

log = logging.getLogger(__name__)


def summarize_sweep(sweep_dir: Path, metric: str = "val/ndcg@10") -> list[dict[str, Any]]:
    """One row per job folder (its overrides and final metrics), best first; written as summary.csv and .md."""
    rows = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: p.name):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        if not overrides_file.is_file():
            continue
        overrides = " ".join(OmegaConf.load(overrides_file))
        metrics_file = job_dir / "metrics.json"
        row: dict[str, Any] = {"job": job_dir.name, "overrides": overrides, "status": "failed"}
        if metrics_file.is_file():
            blob = json.loads(metrics_file.read_text())
            row.update({"status": "ok", **blob.get("val", {}), "global_step": blob.get("global_step")})
            if blob.get("val_before"):
                row[f"{metric} before"] = blob["val_before"].get(metric)
        rows.append(row)
    rows.sort(key=lambda r: -(r.get(metric) if isinstance(r.get(metric), float) else float("-inf")))
    write_summary(sweep_dir, rows)
    return rows


def write_summary(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(sweep_dir / "summary.csv", buffer.getvalue())
    write_text_atomic(sweep_dir / "summary.md", markdown_table(columns, [[row.get(c) for c in columns]
                                                                         for row in rows]))


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra < 1.1
    _HydraCallback = object  # type: ignore[misc,assignment]


class SweepCallback(_HydraCallback):
    """Hydra callback: writes the sweep summary after a multirun (Hydra turns callback errors into warnings, so the
    launcher checks live in ``hydra_plugins/gte_pro_launcher``)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if sweep_dir.is_dir():
            rows = summarize_sweep(sweep_dir, config.get("optimized_metric") or "val/ndcg@10")
            log.info("sweep summary (%d jobs): %s", len(rows), sweep_dir / "summary.csv")
