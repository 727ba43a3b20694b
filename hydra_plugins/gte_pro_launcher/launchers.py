"""Hydra launcher plugins (Hydra only loads launchers from the ``hydra_plugins`` namespace).

The submitit launchers of hydra-submitit-launcher, plus one check before anything is submitted: every job's
``devices`` must equal the launcher's ``tasks_per_node``, since SLURM (or submitit_local) starts one process per
device. (A check in a Hydra callback would only be a warning: Hydra turns callback errors into warnings.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit

from gte_pro.launch.environment import check_devices_match_tasks, without_distributed_env


def _check_jobs(launcher: Any, job_overrides: Sequence[Sequence[str]]) -> None:
    tasks = int(launcher.params.get("tasks_per_node") or 1)
    for overrides in job_overrides:
        values = dict(o.split("=", 1) for o in overrides if "=" in o)
        check_devices_match_tasks(values.get("devices", launcher.config.devices), tasks)


class _CheckedLaunch:
    """Refuses jobs whose ``devices`` differ from ``tasks_per_node``, then submits without the torch.distributed
    variables: sbatch exports the submitting shell's environment to the job, and a MASTER_PORT (or RANK,
    WORLD_SIZE...) left there by an earlier run would override the per-job port Lightning derives from the SLURM job
    id, so that two jobs of one sweep would meet on the same port."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        _check_jobs(self, job_overrides)
        with without_distributed_env():
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]


class LocalLauncher(_CheckedLaunch, _submitit.LocalLauncher):
    """submitit_local with the checks of ``_CheckedLaunch``."""


class SlurmLauncher(_CheckedLaunch, _submitit.SlurmLauncher):
    """submitit_slurm with the checks of ``_CheckedLaunch``."""
