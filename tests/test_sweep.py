"""Hydra multirun sweeps that survive DDP, the submitit local launcher, and launcher/devices validation."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

FAST = ["debug=fast", "logger=none", "callbacks.progress_bar=null"]


def _run(args: list[str], timeout: int = 900) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "train.py", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _folders(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))


def test_ddp_sweep_over_devices_and_lr_gives_one_folder_per_job_and_a_summary(tmp_path: Path, cache_dir: Path):
    sweep = tmp_path / "sweep"
    outputs_before = sorted((REPO / "outputs").rglob("*")) if (REPO / "outputs").exists() else []
    proc = _run(["-m", *FAST, "logger=csv", "strategy=ddp", "devices=2,1", "model.lr=1e-3,2e-3",
                 f"hydra.sweep.dir={sweep}", f"paths.cache_dir={cache_dir}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert _folders(sweep) == ["0", "1", "2", "3"]
    world_sizes = [json.loads((sweep / job / "metrics.json").read_text())["world_size"] for job in "0123"]
    assert sorted(world_sizes) == [1, 1, 2, 2]
    # the rank-1 processes wrote into their job's folder, not a new one
    assert sum((sweep / job / "train_ddp_process_1.log").is_file() for job in "0123") == 2
    outputs_after = sorted((REPO / "outputs").rglob("*")) if (REPO / "outputs").exists() else []
    assert outputs_after == outputs_before
    with (sweep / "summary.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 4 and all(row["status"] == "ok" for row in rows)
    scores = [float(row["val/ndcg@10"]) for row in rows]
    assert scores == sorted(scores, reverse=True)  # best first
    assert {row["overrides"].split("devices=")[1][0] for row in rows} == {"1", "2"}
    # the report: the metric against each swept key, every job's curves, the best job named
    report = (sweep / "report.md").read_text()
    for image in ("metric_vs_devices.png", "metric_vs_model.lr.png", "curves.png"):
        assert f"]({image})" in report and (sweep / image).stat().st_size > 10_000
    assert f"Best: job {rows[0]['job']} (`{rows[0]['overrides']}`)" in report
    assert all((sweep / job / "curves.png").is_file() for job in "0123")


def test_submitit_local_launcher_runs_a_two_task_ddp_job(tmp_path: Path, cache_dir: Path):
    sweep = tmp_path / "local"
    proc = _run(["-m", "hydra/launcher=local", *FAST, "strategy=ddp", "devices=2", f"hydra.sweep.dir={sweep}",
                 f"paths.cache_dir={cache_dir}"])
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert json.loads((sweep / "0" / "metrics.json").read_text())["world_size"] == 2
    logs = "".join(p.read_text(errors="replace") for p in (sweep / ".submitit").rglob("*_log.*"))
    assert "GLOBAL_RANK: 1, MEMBER: 2/2" in logs


def test_launcher_tasks_must_match_devices_before_anything_is_submitted(tmp_path: Path):
    proc = _run(["-m", "hydra/launcher=local", *FAST, "devices=2", "hydra.launcher.tasks_per_node=1",
                 f"hydra.sweep.dir={tmp_path / 'bad'}"], timeout=300)
    assert proc.returncode != 0
    assert "devices=2 but the launcher runs 1 task(s) per node" in proc.stderr
    assert not (tmp_path / "bad" / ".submitit").exists()
    swept = _run(["-m", "hydra/launcher=local", *FAST, "devices=2,1", f"hydra.sweep.dir={tmp_path / 'bad2'}"],
                 timeout=300)
    # the launcher asks for the same tasks_per_node for every job: one of the swept values cannot match it
    assert swept.returncode != 0 and "devices=2 but the launcher runs 1 task(s) per node" in swept.stderr
    assert not (tmp_path / "bad2" / ".submitit").exists()


@pytest.mark.slow
def test_a_failing_job_is_recorded_and_the_others_are_kept(tmp_path: Path, cache_dir: Path):
    sweep = tmp_path / "failing"
    proc = _run(["-m", *FAST, "model.lr=-1,1e-3", f"hydra.sweep.dir={sweep}", f"paths.cache_dir={cache_dir}"])
    assert proc.returncode != 0  # the sweep still fails, after every job ran
    assert "Invalid learning rate" in (sweep / "0" / "error.txt").read_text()
    assert json.loads((sweep / "1" / "metrics.json").read_text())["global_step"] == 4
    with (sweep / "summary.csv").open() as handle:
        rows = {row["job"]: row for row in csv.DictReader(handle)}
    assert rows["1"]["status"] == "ok" and float(rows["1"]["val/ndcg@10"]) > 0
    assert rows["0"]["status"] == "failed" and rows["0"]["error"].startswith("ValueError: Invalid learning rate")
    failed_line = next(line for line in (sweep / "summary.md").read_text().splitlines() if line.startswith("| 0 |"))
    assert "| failed | ValueError: Invalid learning rate: -1.0 |" in failed_line  # model.lr is a float (schema)
