"""Hydra launcher plugins (Hydra only loads launchers from the ``hydra_plugins`` namespace).

The submitit launchers of hydra-submitit-launcher, plus checks before anything is submitted:

- every job's ``devices`` must equal the launcher's ``tasks_per_node``, since SLURM (or submitit_local) starts one
  process per device. (A check in a Hydra callback would only be a warning: Hydra turns callback errors into
  warnings.)
- every string that submitit writes into the sbatch script stays on its own line. submitit quotes option values
  with ``shlex.quote`` (``--job-name='x; rm -rf /'`` is one harmless name), but a newline inside quotes still ends
  the ``#SBATCH`` comment line, and the next line runs as a command; ``additional_parameters`` keys are written
  unquoted. So no launcher string may hold a control character, and option names are plain words.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from hydra_plugins.hydra_submitit_launcher import submitit_launcher as _submitit

from gte_pro.errors import ConfigError, UserError
from gte_pro.launch.environment import check_devices_match_tasks, check_nodes_match, without_distributed_env

_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_OPTION_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]*")


def _strings(value: Any, key: str) -> Iterator[tuple[str, str]]:
    """(config key, string) for every string in a launcher parameter, dict keys included."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, Mapping):
        for name, item in value.items():
            yield f"{key}.{name}", str(name)
            yield from _strings(item, f"{key}.{name}")
    elif isinstance(value, Sequence):
        for index, item in enumerate(value):
            yield from _strings(item, f"{key}[{index}]")


def check_sbatch_params(params: Mapping[str, Any]) -> None:
    """Refuse launcher parameters that could add a line to the generated sbatch script (see the module doc)."""
    for key, value in params.items():
        for where, text in _strings(value, f"hydra.launcher.{key}"):
            if _CONTROL.search(text):
                raise ConfigError(f"{where}={text!r}: a launcher string may not hold a newline or another control "
                                 "character (it would start a new line of the sbatch script)")
    for name in (params.get("additional_parameters") or {}):
        if not _OPTION_NAME.fullmatch(str(name)):
            raise ConfigError(f"hydra.launcher.additional_parameters: {str(name)!r} is not an sbatch option name "
                             "(letters, digits, '-' and '_', e.g. mail-type)")


def _check_jobs(launcher: Any, job_overrides: Sequence[Sequence[str]]) -> None:
    check_sbatch_params(launcher.params)
    tasks = launcher.params.get("tasks_per_node")
    for overrides in job_overrides:
        values = dict(o.split("=", 1) for o in overrides if "=" in o)
        check_devices_match_tasks(values.get("devices", launcher.config.devices), 1 if tasks is None else tasks)
        check_nodes_match(values.get("nodes", launcher.config.get("nodes", 1)), launcher.params.get("nodes"),
                          local=isinstance(launcher, LocalLauncher))


class _CheckedLaunch:
    """Refuses jobs whose ``devices`` differ from ``tasks_per_node`` and strings that could inject sbatch lines,
    then submits without the torch.distributed variables: sbatch exports the submitting shell's environment to the
    job, and a MASTER_PORT (or RANK, WORLD_SIZE...) left there by an earlier run would override the per-job port
    Lightning derives from the SLURM job id, so that two jobs of one sweep would meet on the same port."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        _check_jobs(self, job_overrides)
        with without_distributed_env():
            return super().launch(job_overrides, initial_job_idx)  # type: ignore[misc]


class LocalLauncher(_CheckedLaunch, _submitit.LocalLauncher):
    """submitit_local with the checks of ``_CheckedLaunch``."""


def slurm_missing() -> list[str]:
    """The SLURM commands that submitting needs and PATH lacks: ``sbatch``, and ``srun`` (submitit's own lookup,
    which without it ends in a 40-line traceback)."""
    from submitit.slurm.slurm import SlurmExecutor

    return [name for name, present in (("sbatch", shutil.which("sbatch") is not None),
                                       ("srun", SlurmExecutor.affinity() > 0)) if not present]


def check_slurm_installed() -> None:
    """Refuse ``hydra/launcher=slurm`` on a machine without SLURM, before anything is submitted."""
    if missing := slurm_missing():
        names = " and ".join(f"`{name}`" for name in missing)
        raise UserError(f"hydra/launcher=slurm: SLURM is not installed on this machine ({names} not on PATH), so "
                        "no job can be submitted",
                        hint="run the command on a SLURM login node (or put SLURM's commands on PATH), or drop "
                             "hydra/launcher=slurm to run the jobs here (hydra/launcher=local: submitit's local "
                             "processes)")


class SlurmLauncher(_CheckedLaunch, _submitit.SlurmLauncher):
    """submitit_slurm with the checks of ``_CheckedLaunch``, after one that SLURM is installed."""

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Any:
        check_slurm_installed()
        return super().launch(job_overrides, initial_job_idx)
