"""Launching: DDP under Hydra sweeps, submitit (local and SLURM) jobs, preemption, resume, sweep summaries.

Three traps are handled here, once:
1. Lightning's DDP re-runs ``sys.argv`` for ranks >= 1. Under ``python train.py -m ...`` that child would replay the
   whole sweep. We make the child run exactly the current job (its own overrides, its own run folder, RUN mode).
2. A sweep runs its jobs one after another in one process. Lightning leaves the process group and MASTER_PORT,
   LOCAL_RANK, WORLD_SIZE... in the environment, so the next job would believe it was started by a cluster.
   ``job_scope`` restores the environment and destroys the process group after each job.
3. SLURM starts one task per device (Lightning reads SLURM_* and must not re-launch). ``submitit_local`` starts the
   tasks too but does not look like SLURM: we export the torch.distributed variables ourselves.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import signal
import sys
import time
import zlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

DIST_ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK",
                  "LOCAL_WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")


# --- 1. DDP re-launch under Hydra ----------------------------------------------------------------------------
def ddp_child_command(local_rank: int) -> tuple[list[str], str]:
    """The command that starts rank ``local_rank`` of the *current* Hydra job, and its working directory."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.utils import get_original_cwd, to_absolute_path

    import __main__

    hydra_cfg = HydraConfig.get()
    if __main__.__spec__ is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    command += list(hydra_cfg.overrides.task)  # this job's values only: no "-m", no comma lists
    command += [
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',  # the same folder as rank 0
        "hydra.output_subdir=null",  # rank 0 already wrote .hydra/
        f"hydra.job.name=train_ddp_process_{local_rank}",
        "hydra.mode=RUN",  # an hparams_search preset would otherwise switch the child to MULTIRUN
    ]
    return command, get_original_cwd()


def patch_lightning_ddp_relaunch() -> None:
    """Make Lightning's subprocess launcher start ranks with ``ddp_child_command`` (idempotent)."""
    from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
    from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher

    pytorch_launcher._hydra_subprocess_cmd = ddp_child_command
    fabric_launcher._hydra_subprocess_cmd = ddp_child_command


# --- 2 and 3. One job's distributed environment -------------------------------------------------------------
def _export_submitit_local_env() -> None:
    """Under submitit's local executor with several tasks, tell torch.distributed who is who."""
    tasks = int(os.environ.get("SUBMITIT_LOCAL_NTASKS", "1"))
    if tasks <= 1 or "SUBMITIT_LOCAL_GLOBALID" not in os.environ:
        return
    job_id = os.environ.get("SUBMITIT_LOCAL_JOB_ID", "0")
    os.environ.update({
        "MASTER_ADDR": "127.0.0.1",
        # every task of the job derives the same port from the job id
        "MASTER_PORT": str(20000 + zlib.crc32(job_id.encode()) % 20000),
        "WORLD_SIZE": str(tasks),
        "RANK": os.environ["SUBMITIT_LOCAL_GLOBALID"],
        "LOCAL_RANK": os.environ["SUBMITIT_LOCAL_LOCALID"],
        "NODE_RANK": "0",
    })


def tasks_per_node_from_scheduler() -> int | None:
    """Processes per node that SLURM or submitit_local started for this job, or None when neither did."""
    if "SUBMITIT_LOCAL_NTASKS" in os.environ:
        return int(os.environ["SUBMITIT_LOCAL_NTASKS"])
    value = os.environ.get("SLURM_NTASKS_PER_NODE") or os.environ.get("SLURM_TASKS_PER_NODE")
    if value and "SLURM_JOB_ID" in os.environ and os.environ.get("SLURM_JOB_NAME") not in ("bash", "interactive"):
        return int(value.split("(")[0].split(",")[0])
    return None


def check_devices_match_tasks(devices: Any, tasks_per_node: int | None) -> None:
    """SLURM (or submitit_local) starts one process per device: the two numbers must agree."""
    if tasks_per_node is None or str(devices) == "auto":
        return
    if int(devices) != tasks_per_node:
        raise ValueError(
            f"devices={devices} but the launcher runs {tasks_per_node} task(s) per node: set "
            f"hydra.launcher.tasks_per_node={devices} (the launcher configs default it to ${{devices}}) "
            f"or devices={tasks_per_node}"
        )


def _set_nccl_error_handling() -> None:
    """On GPUs: a rank stuck in a collective (a dead peer, a rank still exporting) raises after the process-group
    timeout (strategy.timeout) instead of hanging the job until the wall-clock limit. The user's values win."""
    import torch

    if torch.cuda.is_available():
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


@contextlib.contextmanager
def job_scope(devices: Any) -> Iterator[None]:
    """Run one training job with a clean distributed environment, and leave one behind."""
    saved = {key: os.environ.get(key) for key in DIST_ENV_KEYS}
    check_devices_match_tasks(devices, tasks_per_node_from_scheduler())
    _export_submitit_local_env()
    _set_nccl_error_handling()
    patch_lightning_ddp_relaunch()
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# --- resume ---------------------------------------------------------------------------------------------------
def resume_checkpoint(ckpt_path: str | None, resume: str, output_dir: Path) -> str | None:
    """An explicit ``ckpt_path`` wins; with ``resume=auto`` a run folder that has ``checkpoints/last.ckpt`` (a
    requeued SLURM job, or a re-run into the same ``hydra.run.dir``) continues from it."""
    if ckpt_path:
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        return str(ckpt_path)
    if resume not in ("auto", "never"):
        raise ValueError(f"resume={resume!r} is not valid; valid choices: auto, never")
    last = output_dir / "checkpoints" / "last.ckpt"
    if resume == "auto" and last.is_file():
        log.info("resuming from %s", last)
        return str(last)
    return None


# --- preemption: checkpoint, then let submitit requeue --------------------------------------------------------
def _submitit_signal() -> int:
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def under_submitit() -> bool:
    """True inside a job that submitit started (its SLURM and local executors both export this)."""
    return "SUBMITIT_EXECUTOR" in os.environ


def preemption_callback() -> Any:
    """A Lightning callback that saves ``last.ckpt`` on submitit's preemption signal before the job requeues."""
    from lightning.pytorch import Callback

    class PreemptionCheckpoint(Callback):
        """On the preemption signal (SIGUSR2), every rank sets a flag; at the next step boundary the ranks agree
        (one tiny all-reduce every ``check_every_n_steps``), all save ``last.ckpt`` together, and then rank 0
        hands over to submitit's own handler, which calls the launcher's ``checkpoint()`` and requeues the job.
        Saving from inside the signal handler could deadlock DDP (one rank in a barrier, one in an all-reduce).
        """

        def __init__(self, output_dir: Path, check_every_n_steps: int = 5) -> None:
            self.output_dir = output_dir
            self.check_every_n_steps = check_every_n_steps
            self._requested = False
            self._submitit_handler: Any = None

        def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
            signum = _submitit_signal()
            self._submitit_handler = signal.getsignal(signum)
            signal.signal(signum, self._on_signal)

        def _on_signal(self, signum: int, frame: Any) -> None:
            log.warning("preemption signal %s received: checkpointing at the next step", signum)
            self._requested = True

        def on_train_batch_end(self, trainer: Any, pl_module: Any, *args: Any) -> None:
            if trainer.global_step % self.check_every_n_steps:
                return
            if not trainer.strategy.reduce_boolean_decision(self._requested, all=False):
                return
            path = self.output_dir / "checkpoints" / "last.ckpt"
            trainer.save_checkpoint(path)
            log.warning("preempted at step %d: saved %s", trainer.global_step, path)
            if trainer.is_global_zero and callable(self._submitit_handler):
                self._submitit_handler(_submitit_signal(), None)  # requeues this job, then exits
            time.sleep(120)  # other ranks: wait for SLURM to stop the job step after the requeue
            sys.exit(0)

    return PreemptionCheckpoint


# --- sweeps ---------------------------------------------------------------------------------------------------
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
    _write_summary(sweep_dir, rows)
    return rows


def _write_summary(sweep_dir: Path, rows: Sequence[dict[str, Any]]) -> None:
    columns = list(dict.fromkeys(key for row in rows for key in row))
    with (sweep_dir / "summary.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)
    fmt = lambda v: f"{v:.4f}" if isinstance(v, float) else ("" if v is None else str(v))  # noqa: E731
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(row.get(c)) for c in columns) + " |" for row in rows]
    (sweep_dir / "summary.md").write_text("\n".join(lines) + "\n")


try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra < 1.1
    _HydraCallback = object  # type: ignore[misc,assignment]


class SweepCallback(_HydraCallback):
    """Hydra callback: writes the sweep summary after a multirun (Hydra turns callback errors into warnings, so the
    launcher checks live in the launcher classes below)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        if sweep_dir.is_dir():
            rows = summarize_sweep(sweep_dir, config.get("optimized_metric") or "val/ndcg@10")
            log.info("sweep summary (%d jobs): %s", len(rows), sweep_dir / "summary.csv")

