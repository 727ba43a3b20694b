"""Lightning's DDP starts ranks >= 1 by re-running ``sys.argv``. Under ``python train.py -m ...`` that child would
replay the whole sweep; here the child runs exactly the current job (its own overrides, its own run folder, RUN
mode)."""

from __future__ import annotations

import sys


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
