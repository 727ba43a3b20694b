"""Launching jobs: one module per job of this package.

- ``relaunch``: Lightning's DDP re-launch of ranks >= 1 under Hydra (single runs and sweeps).
- ``environment``: one job's distributed environment (submitit_local variables, cleanup between sweep jobs,
  the devices == tasks_per_node check, NCCL error handling).
- ``resume``: which checkpoint a run continues from.
- ``preemption``: SLURM's preemption signal -> checkpoint at an agreed step, requeue; SIGTERM/SIGINT -> the same
  checkpoint, then exit 143/130.
- ``stop``: the SIGTERM/SIGINT handler of every job, ``RunStopped`` and the command that resumes a stopped run.
- ``run_lock``: one run per run folder (a flock held by rank 0 or the launcher, a holder record beside it).
- ``sweep``: the summary table of a multirun.

Nothing here imports Lightning at module level: Hydra loads ``sweep`` and the launcher plugins at start-up.
"""
