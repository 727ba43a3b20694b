"""Hydra launcher plugins (Hydra only loads launchers from the ``hydra_plugins`` namespace).

The submitit launchers of hydra-submitit-launcher, plus one check before anything is submitted: every job's
``devices`` must equal the launcher's ``tasks_per_node``, since SLURM (or submitit_local) starts one process per
device. (A check in a Hydra callback would only be a warning: Hydra turns callback errors into warnings.)
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit

from gte_pro.launch import DIST_ENV_KEYS, check_devices_match_tasks


def _check_jobs(launcher: Any, job_overrides: Sequence[Sequence[str]]) -> None:
    tasks = int(launcher.params.get("tasks_per_node") or 1)
    for overrides in job_overrides:
        values = dict(o.split("=", 1) for o in overrides if "=" in o)
        check_devices_match_tasks(values.get("devices", launcher.config.devices), tasks)


@contextlib.contextmanager
def _without_distributed_env() -> Iterator[None]:
    """sbatch exports the submitting shell's environment to the job. A MASTER_PORT (or RANK, WORLD_SIZE...) left
    there by an earlier torch.distributed run would override the per-job port Lightning derives from the SLURM job
    id, and two jobs of one sweep would then meet on the same port."""
    saved = {key: os.environ.pop(key) for key in DIST_ENV_KEYS if key in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


class LocalLauncher(_submitit.LocalLauncher):
    """submitit_local, refusing jobs whose ``devices`` differ from ``tasks_per_node``."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        _check_jobs(self, job_overrides)
        with _without_distributed_env():
            return super().launch(job_overrides, initial_job_idx)


class SlurmLauncher(_submitit.SlurmLauncher):
    """submitit_slurm, refusing jobs whose ``devices`` differ from ``tasks_per_node``."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        _check_jobs(self, job_overrides)
        with _without_distributed_env():
            return super().launch(job_overrides, initial_job_idx)
