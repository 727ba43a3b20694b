"""One ``train.py`` run of ``.gpu/run.sh``'s whole-run rows (gpu_run_rows.py) as a process of its own: started into
its folder with its log, watched through that log (the step it reached), killed with everything it started, waited
for up to a deadline.

Not ``harness.run_train``: that one waits for its command to end, writes a fresh log and sets its own environment,
where the resume row needs the live process (it watches the log and SIGKILLs the run halfway), one log appended to
across the kill and the restart, and the row's own environment (``CUBLAS_WORKSPACE_CONFIG`` for determinism)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from harness import REPO


def start(overrides: list[str], run: Path, log: Path, env: dict[str, str]) -> subprocess.Popen:
    """``python train.py OVERRIDES hydra.run.dir=RUN``, its output appended to ``log`` (a restart continues it)."""
    return subprocess.Popen([sys.executable, str(REPO / "train.py"), *overrides, f"hydra.run.dir={run}"], cwd=REPO,
                            env=env, stdout=log.open("a"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: a kill reaches every rank and worker


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the run's whole process group (DDP ranks, data workers), then reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait(proc: subprocess.Popen, timeout: float) -> int | None:
    """The exit code, or None after killing the run at ``timeout``."""
    try:
        return proc.wait(timeout=max(timeout, 1.0))
    except subprocess.TimeoutExpired:
        kill_group(proc)
        return None


def last_step(text: str) -> int:
    """The last training step a log printed (the throughput callback's ``step N/M``), 0 if none."""
    steps = re.findall(r"step (\d+)/(\d+)", text)
    return int(steps[-1][0]) if steps else 0


def total_steps(text: str) -> int | None:
    steps = re.findall(r"step \d+/(\d+)", text)
    return int(steps[-1]) if steps else None


def fresh(work: Path, name: str) -> tuple[Path, Path]:
    """A run's folder and log, emptied: a folder left with a last.ckpt would resume (``resume=auto``)."""
    run, log = work / name, work / f"{name}.log"
    shutil.rmtree(run, ignore_errors=True)
    log.unlink(missing_ok=True)
    return run, log


def tail(log: Path, lines: int = 25) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.is_file() else ""
