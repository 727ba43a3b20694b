"""Sweep summaries: one row per job (its overrides, final metrics or error), best first, in summary.csv and .md,
and a report.md with pictures (``gte_pro.utils.plots``).

The summary is rewritten after every job, so a sweep whose job raises still leaves one (Hydra runs every job,
then re-raises the first failure and exits non-zero, without calling ``on_multirun_end``). A failed job's
traceback is kept in ``<job dir>/error.txt``; its row says ``failed`` with the exception's last line. A job stopped
on SIGTERM or SIGINT stops the sweep and rewrites the summary itself: its row says ``interrupted``, with the
command that resumes it.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.utils import JobStatus
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from gte_pro.errors import FULL_DISK
from gte_pro.utils.files import write_text_atomic
from gte_pro.utils.plots import plot_sweep
from gte_pro.utils.tables import markdown_table

log = logging.getLogger(__name__)

ERROR_FILE = "error.txt"
INTERRUPTED_FILE = "interrupted.json"  # written by a job stopped on SIGTERM/SIGINT (gte_pro.train), removed on restart
SOUP_DIR = "soup"  # sweep.soup: the soup of the sweep's finished runs (gte_pro.modes.soup)


def _last_line(text: str) -> str:
    """The exception line of a traceback ("ValueError: Invalid learning rate: -1")."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def summarize_sweep(sweep_dir: Path, metric: str = "val/ndcg@10") -> list[dict[str, Any]]:
    """One row per job folder (its overrides and final metrics), best first; written as summary.csv and .md."""
    rows = []
    for job_dir in sorted((p for p in sweep_dir.iterdir() if p.is_dir()), key=lambda p: p.name):
        overrides_file = job_dir / ".hydra" / "overrides.yaml"
        if not overrides_file.is_file():
            continue
        overrides = " ".join(OmegaConf.load(overrides_file))
        metrics_file, error_file = job_dir / "metrics.json", job_dir / ERROR_FILE
        row: dict[str, Any] = {"job": job_dir.name, "overrides": overrides, "status": "not finished"}
        if error_file.is_file():
            row.update({"status": "failed", "error": _last_line(error_file.read_text())})
        elif (job_dir / INTERRUPTED_FILE).is_file():
            stop = json.loads((job_dir / INTERRUPTED_FILE).read_text())
            row.update({"status": "interrupted",
                        "error": f"stopped by {stop.get('signal')}; resume: {stop.get('resume')}"})
        elif metrics_file.is_file():
            blob = json.loads(metrics_file.read_text())
            row.update({"status": "ok", **blob.get("val", {}), "global_step": blob.get("global_step")})
            if blob.get("val_before"):
                row[f"{metric} before"] = blob["val_before"].get(metric)
        rows.append(row)
    rows += soup_rows(sweep_dir)
    rows.sort(key=lambda r: -(r.get(metric) if isinstance(r.get(metric), float) else float("-inf")))
    write_summary(sweep_dir, rows)
    return rows


def soup_rows(sweep_dir: Path) -> list[dict[str, Any]]:
    """The row of ``<sweep dir>/soup`` (sweep.soup), and its table with each member's validation as
    ``<sweep dir>/soup.md``; [] without a soup."""
    metrics_file = sweep_dir / SOUP_DIR / "metrics.json"
    if not metrics_file.is_file():
        return []
    blob = json.loads(metrics_file.read_text())
    members = [Path(member["model"]).parent.name for member in blob.get("members", [])]
    steps = blob.get("greedy_steps") or []
    kept = [Path(step["member"]).parent.name for step in steps if step.get("kept")] if steps else members
    metric = blob.get("metric", "val/ndcg@10")
    lines = [f"# Soup of the sweep's runs ({blob.get('method')})", "",
             markdown_table(["job", metric, *(["greedy"] if steps else [])],
                            [[name, member["val"].get(metric),
                              *(["kept" if name in kept else "skipped"] if steps else [])]
                             for name, member in zip(members, blob.get("members", []), strict=True)]
                            + [[f"soup ({blob.get('method')})", blob.get("val", {}).get(metric),
                                *([""] if steps else [])]], numeric=[False, True, *([False] if steps else [])])]
    write_text_atomic(sweep_dir / "soup.md", "\n".join(lines))
    return [{"job": SOUP_DIR, "overrides": f"sweep.soup={blob.get('method')} of jobs {', '.join(kept)}",
             "status": "ok", **blob.get("val", {})}]


def write_summary(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    # who, what and whether it worked first (also the error of a failed job), then the metrics
    lead = [key for key in ("job", "overrides", "status", "error") if any(key in row for row in rows)]
    columns = list(dict.fromkeys(lead + [key for row in rows for key in row]))
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(rows)
    write_text_atomic(sweep_dir / "summary.csv", buffer.getvalue())
    write_text_atomic(sweep_dir / "summary.md", markdown_table(columns, [[row.get(c) for c in columns]
                                                                         for row in rows]))


def record_interrupted_job(metric: str | None) -> None:
    """A sweep's job stopped on a signal: rewrite the summary now (the signal stops the sweep before Hydra calls
    ``on_job_end``), so that the job's row says interrupted."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return
    sweep_dir = Path(str(HydraConfig.get().sweep.dir))
    if sweep_dir.is_dir():
        rows = summarize_sweep(sweep_dir, metric or "val/ndcg@10")
        log.info("sweep summary (%d jobs): %s", len(rows), sweep_dir / "summary.csv")


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra < 1.1
    _HydraCallback = object  # type: ignore[misc,assignment]


class SweepCallback(_HydraCallback):
    """Hydra callback: writes the sweep summary after a multirun (Hydra turns callback errors into warnings, so the
    launcher checks live in ``hydra_plugins/gte_pro_launcher``)."""

    def on_job_end(self, config: DictConfig, job_return: Any, **kwargs: Any) -> None:
        """After each sweep job: keep a failure's traceback in its folder, then rewrite the summary."""
        if config.hydra.mode != RunMode.MULTIRUN:  # DDP ranks >= 1 re-run their job in RUN mode: no summary
            return
        if job_return.status == JobStatus.FAILED:
            try:
                job_return.return_value  # noqa: B018 - a failed job's return_value re-raises its exception
            except Exception as error:
                trace = "".join(traceback.format_exception(error))
                write_text_atomic(Path(str(config.hydra.runtime.output_dir)) / ERROR_FILE, trace)
        self._summarize(config)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._summarize(config)

    def _summarize(self, config: DictConfig) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if sweep_dir.is_dir():
            metric = config.get("optimized_metric") or "val/ndcg@10"
            rows = summarize_sweep(sweep_dir, metric)
            log.info("sweep summary (%d jobs): %s", len(rows), sweep_dir / "summary.csv")
            try:
                log.info("sweep report: %s", plot_sweep(sweep_dir, rows, metric))
            except OSError as error:
                if error.errno in FULL_DISK:
                    raise  # the user's to know, as anywhere else: two lines, exit code 2
                log.error("sweep report not written: %s: %s", type(error).__name__, error)
            except Exception as error:  # noqa: BLE001 - the summary is written; the pictures are a convenience
                log.error("sweep report not written: %s: %s", type(error).__name__, error)
