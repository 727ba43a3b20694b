"""Preempt one SLURM job many times at random moments; it must end bit-identical to an uninterrupted job.

    python scripts/preemption_storm.py --preemptions 10 --seed 0        # needs `bash scripts/local_slurm.sh start`

Both jobs are `python train.py -m hydra/launcher=slurm` sweeps of one 2-task DDP job (the tiny model, --steps
optimizer steps, validation every epoch). The reference runs undisturbed. The storm job is preempted
``--preemptions`` times, each at a random moment of its current restart:

- ``usr2``: ``scancel --signal=USR2`` (what SLURM sends before a time limit, and what a preemption with
  ``--signal`` sends): every rank saves ``last.ckpt`` at an agreed step and submitit requeues the job;
- ``requeue``: ``scontrol requeue`` (the scheduler takes the node back): SLURM sends SIGTERM to the job's tasks,
  they save ``last.ckpt`` at an agreed step and exit 143, and SLURM starts the job again;
- ``startup``: ``scontrol requeue`` within seconds of a restart, before training has begun (the processes may not
  have a handler yet, SLURM ends them and starts the job again; it resumes from the checkpoint of the restart
  before). A USR2 there is not a case: a process that has not yet installed a handler dies of it, as any
  program would, and SLURM does not requeue a failed job.

Training-time moments wait until the restart has logged a random 1-15 steps past its resume point. After the
last preemption the job runs to the end. Then: every tensor of ``last.ckpt`` and ``model/`` equal to the
reference's (torch.equal), the same ``metrics.json`` numbers, SLURM's restart count equal to the preemptions, and
``metrics.json["restarts"]`` listing each restart's checkpoint and step. Kills inside checkpoint and export writes
are `make reliability`'s kill moments (scripts/fault_injection.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

from fault_injection import identical  # noqa: E402  (the same comparison as make reliability)

MOMENTS = ("usr2", "requeue", "startup")


def moments(count: int, rng: random.Random) -> list[str]:
    """Each kind of moment in turn (so that three preemptions already hold one of each), in a random order."""
    drawn = [MOMENTS[i % len(MOMENTS)] for i in range(count)]
    rng.shuffle(drawn)
    return drawn


def job_command(sweep: Path, cache: Path, steps: int, devices: int) -> list[str]:
    return [sys.executable, "train.py", "-m", "hydra/launcher=slurm", "debug=fast", "strategy=ddp",
            f"devices={devices}", "logger=none", "callbacks.progress_bar=null", "trainer.limit_train_batches=null",
            f"trainer.max_steps={steps}", "trainer.max_epochs=-1", "data.max_train_rows=400",
            "callbacks.early_stopping=null", "+callbacks.throughput.print_every_n_steps=1",
            f"hydra.sweep.dir={sweep}", f"paths.cache_dir={cache}"]


def _env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "PYTHONUNBUFFERED": "1"}


def _job_id(sweep: Path, deadline: float) -> str:
    while time.time() < deadline:
        found = [p.name for p in (sweep / ".submitit").glob("[0-9]*") if p.is_dir()]
        if found:
            return found[0]
        time.sleep(0.5)
    raise TimeoutError(f"no job under {sweep / '.submitit'}")


def _slurm_job(job_id: str) -> dict[str, str]:
    """``scontrol show job``'s fields ({} once the job has left the controller)."""
    out = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True).stdout
    return dict(re.findall(r"(\w+)=(\S*)", out))


def _rank0_log(sweep: Path, job_id: str) -> str:
    return "".join(p.read_text(errors="replace") for p in (sweep / ".submitit" / job_id).glob("*_0_log.*"))


def _progress(log: str) -> tuple[int, int | None]:
    """(restarts that resumed so far, the last step logged since the newest start)."""
    starts = [m.end() for m in re.finditer(r"resuming from .*|Starting with JobEnvironment", log)]
    tail = log[starts[-1]:] if starts else log
    steps = re.findall(r"step (\d+)/", tail)
    return len(re.findall(r"resuming from ", log)), (int(steps[-1]) if steps else None)


def _wait_running(job_id: str, restarts: int, deadline: float) -> None:
    """Until the job runs its ``restarts``-th restart (SLURM's own count)."""
    while time.time() < deadline:
        job = _slurm_job(job_id)
        if job.get("JobState") == "RUNNING" and int(job.get("Restarts", 0)) >= restarts:
            return
        if job.get("JobState") in ("FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            raise RuntimeError(f"job {job_id} ended {job['JobState']} (exit {job.get('ExitCode')}) instead of "
                               f"running restart {restarts}")
        time.sleep(0.5)
    raise TimeoutError(f"job {job_id} is not running restart {restarts}: {_slurm_job(job_id)}")


def _preempt(moment: str, job_id: str, sweep: Path, rng: random.Random, steps: int, deadline: float) -> dict:
    """Wait for the moment, send the signal, and say where the job was."""
    if moment == "startup":
        time.sleep(rng.uniform(0.5, 4.0))
        seen = _progress(_rank0_log(sweep, job_id))[1]
    else:
        target = rng.randint(1, 15)
        first = None
        while time.time() < deadline:
            seen = _progress(_rank0_log(sweep, job_id))[1]
            first = seen if first is None else first
            if seen is not None and first is not None and seen - first >= target:
                break
            time.sleep(0.2)
        else:
            raise TimeoutError(f"job {job_id} made no progress")
        if seen >= steps - 20:
            raise RuntimeError(f"job {job_id} is at step {seen} of {steps}: raise --steps for this many preemptions")
    command = (["scancel", "--signal=USR2", job_id] if moment == "usr2"
               else ["scontrol", "requeue", job_id])
    subprocess.run(command, check=True, capture_output=True)
    return {"moment": moment, "last_step_logged": seen, "time": time.strftime("%H:%M:%S")}


def storm(work: Path, preemptions: int, steps: int, devices: int, seed: int, timeout: float) -> dict[str, Any]:
    rng = random.Random(seed)
    cache = work / "cache"
    started = time.time()
    reference = subprocess.run(job_command(work / "reference", cache, steps, devices), cwd=REPO, env=_env(),
                               capture_output=True, text=True, timeout=timeout)
    if reference.returncode != 0:
        raise RuntimeError(f"the reference job failed:\n{(reference.stdout + reference.stderr)[-3000:]}")
    reference_s = time.time() - started
    sweep = work / "storm"
    started = time.time()
    deadline = started + timeout
    launcher = subprocess.Popen(job_command(sweep, cache, steps, devices), cwd=REPO, env=_env(),
                                stdout=(work / "storm-launcher.log").open("w"), stderr=subprocess.STDOUT)
    events, job_id = [], ""
    try:
        job_id = _job_id(sweep, deadline)
        for index, moment in enumerate(moments(preemptions, rng)):
            _wait_running(job_id, index, deadline)
            events.append(_preempt(moment, job_id, sweep, rng, steps, deadline))
            print(f"preemption {index + 1}/{preemptions}: {events[-1]}", flush=True)
            _wait_running(job_id, index + 1, deadline)
        launcher.wait(timeout=max(1.0, deadline - time.time()))
    finally:
        if launcher.poll() is None:
            launcher.kill()
            if job_id:
                subprocess.run(["scancel", job_id], capture_output=True)
    if launcher.returncode != 0:
        raise RuntimeError(f"the storm's launcher exited {launcher.returncode}: see {work / 'storm-launcher.log'}")
    same_weights, same_metrics = identical(sweep / "0", work / "reference" / "0")
    metrics = json.loads((sweep / "0" / "metrics.json").read_text())
    restarts = metrics.get("restarts") or []
    return {"preemptions": preemptions, "seed": seed, "devices": devices, "steps": steps, "job_id": job_id,
            "slurm_restarts": int(_slurm_job(job_id).get("Restarts", preemptions)) if _slurm_job(job_id) else None,
            "restarts_recorded": len(restarts), "resumed_steps": [r["step"] for r in restarts],
            "identical_weights": same_weights, "same_metrics": same_metrics, "global_step": metrics["global_step"],
            "moments": events, "reference_s": round(reference_s, 1), "storm_s": round(time.time() - started, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preemptions", type=int, default=10)
    parser.add_argument("--steps", type=int, default=400, help="optimizer steps of the job (25 an epoch)")
    parser.add_argument("--devices", type=int, default=2, help="DDP tasks of the job")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="folder for the jobs (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole storm may take")
    parser.add_argument("--json", type=Path, default=None, help="write the result here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gte_pro_storm_"))
    work.mkdir(parents=True, exist_ok=True)
    result = storm(work, args.preemptions, args.steps, args.devices, args.seed, args.timeout)
    print(json.dumps({k: v for k, v in result.items() if k != "moments"}))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = result["identical_weights"] and result["same_metrics"] and result["slurm_restarts"] == args.preemptions
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
