"""``train(cfg)``: the one entry point of every run; ``cfg.mode`` picks the flow.

``train.py`` at the repository root is a thin ``@hydra.main`` wrapper around this function; the tests call it
with configs made by Hydra's compose API. Each call is one job with its own distributed environment
(``job_scope``), so that a sweep can run many jobs in one process. Each job holds its run folder for its duration
(``gte_pro.launch.run_lock``: a second start of the folder is refused) and stops on SIGTERM/SIGINT
(``gte_pro.launch.stop``): it saves what it can, logs one line saying what and how to resume, and records itself
as interrupted (``interrupted.json``; a sweep's summary says so).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from omegaconf import DictConfig

from gte_pro.config.checks import check_config
from gte_pro.errors import RunStopped
from gte_pro.launch.environment import job_scope
from gte_pro.launch.run_lock import run_folder_lock, takes_the_lock
from gte_pro.launch.stop import resume_command, stop_on_signals, under_submitit
from gte_pro.launch.sweep import INTERRUPTED_FILE, record_interrupted_job
from gte_pro.mining.kept_window import WINDOW_FILE
from gte_pro.modes.evaluate import evaluate
from gte_pro.modes.fit import fit
from gte_pro.modes.merge import merge
from gte_pro.modes.mine import mine
from gte_pro.modes.score import score
from gte_pro.utils.files import write_json_atomic
from gte_pro.utils.quiet import quiet_third_party

log = logging.getLogger(__name__)

MODES = {"train": fit, "eval": evaluate, "mine": mine, "score": score, "merge": merge}


def train(cfg: DictConfig) -> float | None:
    """Run ``cfg.mode`` (train: fit + export; eval: evaluate only; mine: hard negatives; score: teacher scores; merge:
    a model soup); return ``cfg.optimized_metric`` (None for mine and score)."""
    quiet_third_party()  # the log keeps what a user can act on (gte_pro.utils.quiet)
    check_config(cfg)  # a wrong type, range or mode fails here, naming the key, not as a TypeError deep inside
    mode = cfg.mode
    run_dir = Path(cfg.paths.output_dir)
    holder = takes_the_lock()  # before job_scope exports the ranks of a submitit_local job
    with stop_on_signals(), run_folder_lock(run_dir), job_scope(cfg.devices, cfg.nodes):
        if holder:
            (run_dir / INTERRUPTED_FILE).unlink(missing_ok=True)  # started again: no longer interrupted
        try:
            return MODES[mode](cfg)
        except RunStopped as stopped:
            if holder:  # the other ranks stop with it, silently: one line per run
                _report_stop(stopped, mode, run_dir, cfg.get("optimized_metric"))
            if under_submitit():  # a SLURM job: its exit code says it, not a traceback in the job's log; SLURM
                raise SystemExit(stopped.exit_code) from None  # requeues it or ends it (no submitit result)
            raise


def kept_after_stop(mode: str, run_dir: Path) -> str:
    """What a run stopped outside training's step loop leaves to resume from."""
    if mode == "score":
        shards = run_dir / "score_shards"
        done = len(list(shards.glob("*.json"))) if shards.is_dir() else 0
        return f"{done} finished shard(s) in {shards} (the same command scores only the others)"
    if mode == "mine" and (run_dir / WINDOW_FILE).is_file():
        return f"the embedder's mined window in {run_dir / WINDOW_FILE} (the same command continues with the teacher)"
    if mode == "train":
        last = run_dir / "checkpoints" / "last.ckpt"
        return f"{last} (its newest checkpoint)" if last.is_file() else "no checkpoint yet: the run starts over"
    return f"nothing partial (mode={mode} writes its results at the end): the same command starts it over"


def _report_stop(stopped: RunStopped, mode: str, run_dir: Path, metric: str | None) -> None:
    """One log line (what was saved, the command that resumes) and the interrupted record that a sweep's summary
    reads."""
    saved = stopped.saved or kept_after_stop(mode, run_dir)
    command = resume_command(run_dir)
    log.warning("mode=%s stopped by %s (exit code %d); saved: %s; resume with: %s", mode,
                str(stopped).removeprefix("stopped by "), stopped.exit_code, saved, command)
    write_json_atomic(run_dir / INTERRUPTED_FILE, {"signal": str(stopped).removeprefix("stopped by "),
                                                   "exit_code": stopped.exit_code, "saved": saved,
                                                   "resume": command, "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    record_interrupted_job(metric)
