"""One job's distributed environment.

- A sweep runs its jobs one after another in one process. Lightning leaves the process group and MASTER_PORT,
  LOCAL_RANK, WORLD_SIZE... in the environment, so the next job would believe it was started by a cluster:
  ``job_scope`` restores the environment and destroys the process group after each job.
- SLURM starts one task per device (Lightning reads SLURM_* and must not re-launch). ``submitit_local`` starts the
  tasks too but does not look like SLURM: we export the torch.distributed variables ourselves.
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Iterator, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from gte_pro.errors import ConfigError
from gte_pro.launch.relaunch import patch_lightning_ddp_relaunch

DIST_ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK", "GLOBAL_RANK",
                 "LOCAL_WORLD_SIZE", "PL_GLOBAL_SEED", "PL_SEED_WORKERS")


def run_stamp() -> str:
    """The last part of a single run's folder (``hydra.run.dir``): the start time, or under torchrun the rendezvous
    id, which every process on every node shares: each would stamp its own start time into a folder of its own."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or (run_id == "none" and int(os.environ.get("WORLD_SIZE", "1")) <= 1):
        return datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    if run_id == "none":  # torchrun's default when --rdzv-id is not given (--standalone makes one up)
        raise ConfigError("torchrun without --rdzv-id: its processes cannot agree on one run folder (each would "
                         "stamp its own start time). Give every torchrun the same --rdzv-id NAME (the run folder is "
                         "then outputs/<task>/torchrun-NAME), or hydra.run.dir=<a folder every node sees>")
    return "torchrun-" + re.sub(r"[^A-Za-z0-9._-]", "_", run_id)


# overrides that do not tell runs apart (where they log, not what they train)
UNNAMED_OVERRIDES = ("logger", "hydra", "paths", "callbacks")
TRACKER_NAME_LIMIT = 128  # wandb shows about this much of a run's name


def run_name(task_name: str, overrides: Sequence[str] = (), job_num: int | None = None) -> str:
    """A tracker's name for a run: the task, the sweep job's number (sweep jobs share their task and may share
    their overrides with an earlier sweep) and the overrides that set what it trains, e.g.
    ``lr_sweep-3 model.lr=2e-5 seed=1``."""
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0].split(".")[0].split("/")[0]
            not in UNNAMED_OVERRIDES]
    name = task_name if job_num is None else f"{task_name}-{job_num}"
    return " ".join([name, *kept])[:TRACKER_NAME_LIMIT]


def hydra_run_name(task_name: str) -> str:
    """``run_name`` of the running Hydra job (its task overrides, its number in a sweep); ``task_name`` alone for a
    config composed without Hydra's runtime (the tests, a notebook)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return task_name
    hydra = HydraConfig.get()
    job_num = hydra.job.num if hydra.mode == RunMode.MULTIRUN else None
    return run_name(task_name, list(hydra.overrides.task), job_num)


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this CPU computes bf16 natively (avx512_bf16 or AMX flags in /proc/cpuinfo); None where it cannot
    tell (no /proc/cpuinfo). Without it torch emulates bf16 matmuls, about 10x slower than fp32."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = {flag for line in cpuinfo.splitlines() if line.startswith("flags") for flag in line.split()}
    return bool(flags & {"avx512_bf16", "amx_bf16"})


def emulated_bf16_warning(precision: str, on_cpu: bool, native: bool | None) -> str | None:
    """The warning for a bf16 precision on a CPU that only emulates it (None when it does not apply)."""
    if not (on_cpu and str(precision).startswith("bf16") and native is False):
        return None
    import torch

    return (f"precision={precision} on a CPU without native bf16 (capability {torch.backends.cpu.get_cpu_capability()}"
            ", no avx512_bf16/AMX): torch emulates bf16 here, about 10x slower than fp32. Use precision=32-true on "
            "this machine; bf16 pays off on GPUs and on CPUs with avx512_bf16 or AMX.")


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


def device_count(devices: Any) -> int | None:
    """How many processes ``devices`` asks for: a positive integer, a list of device indices or ``"0,1"``; None for
    ``auto`` and -1 (all the machine has). Anything else is a ValueError naming the key and the valid forms."""
    text = str(devices).strip().strip("'\"")
    if text in ("auto", "-1"):
        return None
    if isinstance(devices, Sequence) and not isinstance(devices, str):  # a list (or Hydra's ListConfig) of indices
        if devices and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in devices):
            return len(devices)
    parts = text.split(",")
    if not isinstance(devices, bool) and all(p.strip().isdigit() for p in parts):
        count = int(parts[0]) if len(parts) == 1 else len(parts)
        if count >= 1:
            return count
    raise ConfigError(f"devices={devices!r} is not valid; valid choices: a positive integer, auto, -1 (all), or "
                     "device indices such as [0,1]")


def check_devices_match_tasks(devices: Any, tasks_per_node: Any) -> None:
    """SLURM (or submitit_local) starts one process per device: the two numbers must agree."""
    if tasks_per_node is None:
        return
    if isinstance(tasks_per_node, bool) or not str(tasks_per_node).strip().isdigit() or int(tasks_per_node) < 1:
        raise ConfigError(f"hydra.launcher.tasks_per_node={tasks_per_node!r} is not valid; valid choices: a positive "
                         "integer, one task per device (the launcher configs default it to ${devices})")
    tasks_per_node = int(tasks_per_node)
    wanted = device_count(devices)
    if wanted is not None and wanted != tasks_per_node:
        raise ConfigError(
            f"devices={devices} but the launcher runs {tasks_per_node} task(s) per node: set "
            f"hydra.launcher.tasks_per_node={devices} (the launcher configs default it to ${{devices}}) "
            f"or devices={tasks_per_node}"
        )


def check_nodes_match(nodes: Any, launcher_nodes: Any, local: bool) -> None:
    """``nodes`` (the job's) must be what the launcher allocates: SLURM's ``nodes`` is resolved once for a whole
    sweep, so a sweep over ``nodes`` (like one over ``devices``) cannot be submitted; submitit_local is one machine."""
    if isinstance(nodes, bool) or not str(nodes).strip().isdigit() or int(nodes) < 1:
        raise ConfigError(f"nodes={nodes!r} is not valid; valid choices: a positive integer")
    nodes = int(nodes)
    if local and nodes != 1:
        raise ConfigError(f"nodes={nodes} with hydra/launcher=local: it starts every task on this machine; use "
                         "hydra/launcher=slurm for several nodes, or nodes=1")
    if launcher_nodes is not None and not local and int(launcher_nodes) != nodes:
        raise ConfigError(f"nodes={nodes} but hydra.launcher.nodes={launcher_nodes}: the launcher allocates one node "
                         "count for the whole sweep; leave hydra.launcher.nodes at ${nodes} and run one sweep per "
                         "node count")


def _set_nccl_error_handling() -> None:
    """On GPUs: a rank stuck in a collective (a dead peer, a rank still exporting) raises after the process-group
    timeout (strategy.timeout) instead of hanging the job until the wall-clock limit. The user's values win."""
    import torch

    if torch.cuda.is_available():
        os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
        os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")


@contextlib.contextmanager
def without_distributed_env() -> Iterator[None]:
    """The torch.distributed variables removed for the duration (restored after)."""
    saved = {key: os.environ.pop(key) for key in DIST_ENV_KEYS if key in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def check_multi_node_launch(nodes: Any) -> None:
    """Several nodes need something that starts a process per device on each of them (SLURM, torchrun): started
    by hand on one machine, rank 0 would wait for the other nodes until the process-group timeout."""
    if int(nodes or 1) <= 1:
        return
    if "SLURM_JOB_ID" in os.environ or "TORCHELASTIC_RUN_ID" in os.environ or "NODE_RANK" in os.environ:
        return
    raise ConfigError(f"nodes={nodes} needs a multi-node launcher: python train.py -m hydra/launcher=slurm "
                     f"nodes={nodes} ..., or torchrun --nnodes {nodes} on each node (README: SLURM, Nodes)")


@contextlib.contextmanager
def job_scope(devices: Any, nodes: Any = 1) -> Iterator[None]:
    """Run one training job with a clean distributed environment, and leave one behind."""
    saved = {key: os.environ.get(key) for key in DIST_ENV_KEYS}
    check_devices_match_tasks(devices, tasks_per_node_from_scheduler())
    check_multi_node_launch(nodes)
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
