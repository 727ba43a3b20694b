"""Real SLURM (the one-node cluster of scripts/local_slurm.sh): sweeps of 2-task DDP jobs, preemption + requeue.

CI starts the cluster before the tests (`bash scripts/local_slurm.sh start`); elsewhere these tests are skipped.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.slurm_helpers import slurm_env, slurm_up, two_nodes_up

pytestmark = pytest.mark.skipif(not slurm_up(), reason="no SLURM cluster: run `bash scripts/local_slurm.sh start`")

SWEEP = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", "debug=fast", "strategy=ddp", "logger=none",
         "callbacks.progress_bar=null"]
# the ranks of one job: two tasks on one node, or one task on each of two nodes (GTE_SLURM_NODES=2)
TOPOLOGIES = {"one-node": ["devices=2"], "two-nodes": ["nodes=2", "devices=1"]}


def test_slurm_sweep_runs_each_job_as_a_two_task_ddp_job(tmp_path: Path, cache_dir: Path):
    sweep = tmp_path / "sweep"
    cmd = SWEEP + ["devices=2", "model.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}", f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=slurm_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0", "1"]
    for job in ("0", "1"):
        assert json.loads((sweep / job / "metrics.json").read_text())["world_size"] == 2
    rank_logs = "".join(p.read_text() for p in (sweep / ".submitit").rglob("*_log.err"))
    assert rank_logs.count("GLOBAL_RANK: 0, MEMBER: 1/2") == 2 and rank_logs.count("GLOBAL_RANK: 1, MEMBER: 2/2") == 2
    summary = (sweep / "summary.csv").read_text().splitlines()
    assert len(summary) == 3 and "model.lr=0.001" in "".join(summary) and "model.lr=0.002" in "".join(summary)


def _wait_for(pattern: str, folder: Path, timeout: float) -> tuple[str, Path]:
    deadline = time.time() + timeout
    while time.time() < deadline:
        for log in folder.rglob("*_0_log.*"):
            match = re.search(pattern, log.read_text(errors="replace"))
            if match:
                return match.group(0), log
        time.sleep(1)
    raise TimeoutError(f"no {pattern!r} in the logs under {folder} after {timeout}s")


@pytest.mark.slow
@pytest.mark.parametrize("topology", list(TOPOLOGIES))
def test_preempted_job_checkpoints_requeues_and_resumes_to_the_same_final_step(tmp_path: Path, cache_dir: Path,
                                                                               topology: str):
    if topology == "two-nodes" and not two_nodes_up():
        pytest.skip("needs the two simulated nodes: GTE_SLURM_NODES=2 bash scripts/local_slurm.sh start")
    sweep = tmp_path / "preempt"
    # every epoch (25 steps) validates: 300 steps keep the run after the signal to a minute or two on 2 cores
    steps = 300
    cmd = SWEEP + TOPOLOGIES[topology] + [
        f"hydra.sweep.dir={sweep}", f"paths.cache_dir={cache_dir}", "trainer.limit_train_batches=null",
        f"trainer.max_steps={steps}", "trainer.max_epochs=-1", "data.max_train_rows=400",
        "callbacks.early_stopping=null"]  # the step count must not depend on when validation plateaus
    launcher = subprocess.Popen(cmd, cwd=REPO, env=slurm_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
    try:
        _, log = _wait_for(rf"step ([4-9]\d|[12]\d\d)/{steps}", sweep / ".submitit", timeout=300)
        job_id = log.parent.name.split("_")[0]
        subprocess.run(["scancel", "--signal=USR2", job_id], check=True)
        output, _ = launcher.communicate(timeout=600)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the preempted job did not finish in 600 s\n{_slurm_report(sweep)}")
    finally:
        launcher.kill()
    assert launcher.returncode == 0, output[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in (sweep / ".submitit").rglob("*_0_log.*"))
    preempted_at = int(re.search(r"preempted at step (\d+)", logs).group(1))
    assert 0 < preempted_at < steps
    assert "resuming from" in logs and "last.ckpt" in logs
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    assert metrics["resumed_from"].endswith("checkpoints/last.ckpt")
    assert metrics["global_step"] == steps  # what an uninterrupted run ends at
    assert metrics["world_size"] == 2
    states = _job_states(job_id, until="COMPLETED", timeout=120)
    assert "REQUEUED" in states and "COMPLETED" in states


def _slurm_report(sweep: Path) -> str:
    """What SLURM and the job's logs say: for a test that timed out."""
    report = [subprocess.run(cmd, capture_output=True, text=True).stdout for cmd in
              (["squeue"], ["sacct", "-D", "-X", "-o", "JobID,State,Start,End,NodeList"], ["sinfo", "-N"])]
    for log in sorted((sweep / ".submitit").rglob("*_log.*")):
        lines = log.read_text(errors="replace").splitlines()
        report.append(f"--- {log.name} (last 15 lines)\n" + "\n".join(line[:200] for line in lines[-15:]))
    return "\n".join(report)


def _job_states(job_id: str, until: str, timeout: float) -> str:
    """The job's states in the accounting database, all its requeued runs (-D) included.

    The launcher returns as soon as the job has written its result, a moment before slurmctld reports the end to
    slurmdbd, so accounting can still say RUNNING: poll until `until` shows up.
    """
    deadline = time.time() + timeout
    while True:
        states = subprocess.run(["sacct", "-j", job_id, "-D", "-X", "-n", "-o", "State"], capture_output=True,
                                text=True).stdout
        if until in states or time.time() > deadline:
            return states
        time.sleep(2)


@pytest.mark.slow
def test_a_job_preempted_three_times_ends_bit_identical_and_its_log_says_so(tmp_path: Path):
    """scripts/preemption_storm.py on the local SLURM: one 2-task DDP job preempted once by SIGUSR2 during training,
    once by `scontrol requeue` during training and once by `scontrol requeue` during its start-up, against an
    undisturbed job. (`make reliability` runs the same storm ten times over.)"""
    report = tmp_path / "storm.json"
    done = subprocess.run([sys.executable, "scripts/preemption_storm.py", "--preemptions", "3", "--steps", "300",
                           "--seed", "3", "--work", str(tmp_path / "work"), "--json", str(report),
                           "--timeout", "1500"], cwd=REPO, env=slurm_env(), capture_output=True, text=True,
                          timeout=1700)
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    result = json.loads(report.read_text())
    assert sorted(event["moment"] for event in result["moments"]) == ["requeue", "startup", "usr2"]
    assert result["identical_weights"] and result["same_metrics"] and result["global_step"] == 300
    assert result["slurm_restarts"] == 3
    # a requeue during the first start-up resumes nothing: every other restart continued from a checkpoint
    assert len(result["resumed_steps"]) >= 2 and all(0 < step < 300 for step in result["resumed_steps"])
    job_log = "".join(p.read_text(errors="replace") for p in (tmp_path / "work" / "storm" / ".submitit")
                      .rglob("*_0_log.*"))
    last = len(result["resumed_steps"])
    assert f"restart {last} of this run folder; SLURM job {result['job_id']}, requeued" in job_log
