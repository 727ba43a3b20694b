"""Which checkpoint a run continues from, and whether the run asking is the run that wrote it.

``resume=auto`` continues a run folder's newest intact checkpoint (``checkpoints/last.ckpt``, else the
``previous.ckpt`` that ``AtomicCheckpointIO`` keeps); a corrupt one is reported and set aside. A run folder also
records the training-relevant part of the config it was started with (``run_config.json``): resuming
it with a different model, data, loss, batch size, learning rate, seed, ... is an error listing the keys, unless
``resume=force``, which continues and records the differences.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from gte_pro.errors import MissingFileError, ResumeError
from gte_pro.launch.checkpoint_io import LAST, PREVIOUS, is_intact
from gte_pro.launch.renamed import RENAMED_TARGETS
from gte_pro.utils.files import remove_stale_temporaries, write_json_atomic
from gte_pro.utils.secrets import redact_secrets

log = logging.getLogger(__name__)

RESUME_CHOICES = ("auto", "never", "force")
RUN_CONFIG = "run_config.json"
RESOLVED = "resolved"  # run_config.json's record of what the config left to the machine and data
RESTARTS = "restarts.jsonl"  # one line per start of this run folder that resumed a checkpoint

# keys that change where or how a run reports, not what it trains: free to differ on resume
NOT_TRAINING = ("paths", "logger", "callbacks", "hydra", "export", "eval", "task_name", "ckpt_path", "resume",
                "optimized_metric", "mode", "lr_find", "lr_find_steps", "matmul_precision",
                "data.num_workers", "data.pin_memory", "data.persistent_workers", "data.cache_dir",
                "data.eval_batch_size", "trainer.log_every_n_steps", "trainer.default_root_dir",
                "trainer.enable_progress_bar", "trainer.num_sanity_val_steps",
                "model.length_chunks",  # the same rows and loss, computed in other chunks
                "trainer.memory_budget",  # a check only: loss.mini_batch_size=auto reuses its first choice
                RESOLVED)  # what the latest start decided on its machine (record_resolved), not a setting


DECONTAMINATION = ("data.decontaminate", "data.decontaminate_threshold", "data.decontaminate_num_perm")


def remove_leftovers(output_dir: Path) -> None:
    """Rank 0, before a run resumes: temporary files of a killed earlier start (a checkpoint, an export half
    written) go first."""
    if rank_zero_only.rank != 0:
        return
    for folder in (output_dir, output_dir / "checkpoints"):
        for path in remove_stale_temporaries(folder):
            log.info("removed %s, left by a run that was killed while writing it", path)


def _newest_intact(folder: Path) -> Path | None:
    """The newest checkpoint of ``folder`` that reads back whole; corrupt ones are renamed aside (rank 0), so that
    the next save cannot rotate them into ``previous.ckpt`` over a good one."""
    for name in (LAST, PREVIOUS):
        path = folder / name
        if not path.is_file():
            continue
        problem = is_intact(path)
        if problem is None:
            return path
        log.error("checkpoint %s is damaged (%s): trying an older one", path, problem)
        if rank_zero_only.rank == 0:
            aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
            path.rename(aside)
            log.error("moved the damaged checkpoint to %s", aside)
    return None


def resume_checkpoint(ckpt_path: str | None, resume: str, output_dir: Path) -> str | None:
    """An explicit ``ckpt_path`` wins; with ``resume=auto`` (or ``force``) a run folder that holds a checkpoint (a
    requeued SLURM job, a killed run started again with the same ``hydra.run.dir``) continues from it."""
    if ckpt_path:
        if not Path(ckpt_path).is_file():
            raise MissingFileError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        if problem := is_intact(ckpt_path):
            raise ResumeError(f"ckpt_path={ckpt_path}: the checkpoint is damaged ({problem})")
        return str(ckpt_path)
    folder = output_dir / "checkpoints"
    if resume == "never" or not any((folder / name).is_file() for name in (LAST, PREVIOUS)):
        return None
    found = _newest_intact(folder)
    if found is None:
        raise ResumeError(f"{folder} holds no intact checkpoint to resume from (damaged ones were renamed "
                         "*.corrupt-*): start a new run folder, or pass resume=never to train this one from scratch")
    return str(found)


def record_restart(output_dir: Path, ckpt_path: str | None) -> dict[str, Any] | None:
    """Log and append to ``<run>/restarts.jsonl`` (rank 0) what this start resumes from: the checkpoint, its step
    and epoch, and the SLURM job and requeue count when there is one. A preempted job's history is then one file:
    how many times it came back and what each restart continued from. A start from scratch clears the history."""
    if rank_zero_only.rank != 0:  # one line and one record per start, whatever the number of ranks
        return None
    if ckpt_path is None:
        (output_dir / RESTARTS).unlink(missing_ok=True)
        return None
    checkpoint = torch.load(ckpt_path, map_location="cpu", mmap=True, weights_only=True)
    earlier = restart_history(output_dir)
    entry = {"restart": len(earlier) + 1, "resumed_from": ckpt_path, "step": int(checkpoint.get("global_step", 0)),
             "epoch": int(checkpoint.get("epoch", 0)), "host": socket.gethostname(),
             "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
             "slurm_restart_count": _int_or_none(os.environ.get("SLURM_RESTART_COUNT"))}
    slurm = (f"; SLURM job {entry['slurm_job_id']}, requeued {entry['slurm_restart_count'] or 0} time(s)"
             if entry["slurm_job_id"] else "")
    log.info("resuming from %s (step %d, epoch %d): restart %d of this run folder%s", ckpt_path, entry["step"],
             entry["epoch"], entry["restart"], slurm)
    path = output_dir / RESTARTS
    cut = path.is_file() and not path.read_bytes().endswith(b"\n")  # a kill during the last append
    with path.open("a", encoding="utf-8") as out:
        out.write(("\n" if cut else "") + json.dumps(entry) + "\n")
        out.flush()
        os.fsync(out.fileno())
    return entry


def restart_history(output_dir: Path) -> list[dict[str, Any]]:
    """Every restart recorded in ``<run>/restarts.jsonl`` (a line cut by a kill is skipped: it is the last one)."""
    path = output_dir / RESTARTS
    if not path.is_file():
        return []
    entries = []
    for line in path.read_text(encoding="utf-8").splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            entries.append(json.loads(line))
    return entries


def _int_or_none(value: str | None) -> int | None:
    return int(value) if value and value.isdigit() else None


def training_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as flat ``a.b.c`` keys, without the keys that do not change what is trained."""
    flat: dict[str, Any] = {}

    def walk(node: Any, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(value, f"{prefix}{key}.")
        else:
            flat[prefix[:-1]] = node

    walk(redact_secrets(OmegaConf.to_container(cfg, resolve=True)), "")
    remine = flat.get("data.remine.every_n_epochs") or flat.get("data.remine.at_start")
    # mine.* (mode=mine) shapes training only through re-mining
    skipped = NOT_TRAINING if remine else (*NOT_TRAINING, "mine")
    # data.decontaminate=report/off trains the same rows; with drop, the overlap with eval.beir decides which
    kept = ("eval.beir", "eval.split") if flat.get("data.decontaminate") == "drop" else ()
    if not kept:
        skipped = (*skipped, *DECONTAMINATION)
    return {key: value for key, value in flat.items()
            if key in kept or not any(key == skip or key.startswith(skip + ".") for skip in skipped)}


def _changed(then: Any, now: Any, recorded: bool) -> bool:
    # a key the record lacks came with a newer version of the project: only a setting that is on is a change
    if isinstance(then, str):
        then = RENAMED_TARGETS.get(then, then)
    return then != now if recorded else now not in (None, False, 0, "", [], {})


def check_resumed_config(cfg: DictConfig, output_dir: Path, ckpt_path: str | None) -> dict[str, list[Any]]:
    """Record the training config of a new run (rank 0); for a resumed one, the keys that differ from it as
    ``{key: [then, now]}``, which are an error unless ``resume=force``."""
    record = output_dir / RUN_CONFIG
    now = training_config(cfg)
    if ckpt_path is None or not record.is_file():  # a new run, or a folder from before records were kept
        if rank_zero_only.rank == 0:
            write_json_atomic(record, now)
        return {}
    then = json.loads(record.read_text(encoding="utf-8"))
    # a key this version no longer counts as training (e.g. trainer.memory_budget) is no change, whatever was kept
    then = {key: value for key, value in then.items()
            if key in now or not any(key == skip or key.startswith(skip + ".") for skip in NOT_TRAINING)}
    changed = {key: [then.get(key), now.get(key)] for key in sorted(then.keys() | now.keys())
               if _changed(then.get(key), now.get(key), key in then)}
    if changed and cfg.get("resume") != "force":
        lines = "\n".join(f"  {key}: {old!r} -> {new!r}" for key, (old, new) in changed.items())
        raise ResumeError(f"{output_dir} was trained with another config than this run's; the checkpoint would "
                         f"continue a different training. Changed keys:\n{lines}\nUse a new run folder, or "
                         "resume=force to continue anyway (the changes are recorded in metrics.json).")
    if changed:
        log.warning("resume=force: continuing %s with %d changed key(s): %s", output_dir, len(changed),
                    ", ".join(changed))
    return changed


def record_resolved(output_dir: Path, resolved: dict[str, Any]) -> None:
    """Keep what this start decided for the config (``gte_pro.config.resolve`` and the pre-flight: processes,
    device, the teacher's temperature, the mini-batch, the length chunks) in ``run_config.json`` under
    ``resolved`` (rank 0); a resumed start replaces the earlier start's, the training keys stay as they were."""
    record = output_dir / RUN_CONFIG
    if rank_zero_only.rank != 0 or not record.is_file():
        return
    kept = json.loads(record.read_text(encoding="utf-8"))
    write_json_atomic(record, {**kept, RESOLVED: resolved})
