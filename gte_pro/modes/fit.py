"""``mode=train``: build everything from the config, validate, fit, validate the best model, export.

Writes ``<run dir>/metrics.json`` and ``<run dir>/model/`` (plus the exports of ``export/``) on rank 0.
"""

from __future__ import annotations

import contextlib
import json
import logging
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from gte_pro.config.cross_keys import DISTILL_LOSSES
from gte_pro.data.validation import saturation_warnings
from gte_pro.evaluation.report import below_val_before, merge_results, metrics_table, optimized_value
from gte_pro.evaluation.sets import eval_set_source
from gte_pro.export.cross_encoder import export_cross_encoder, release_reranker
from gte_pro.export.quantization import write_quantization
from gte_pro.export.release import check_export_requirements, release
from gte_pro.export.writers import export_sentence_transformers
from gte_pro.launch.fsdp import is_sharded, unsharded_module
from gte_pro.launch.preemption import PreemptionCheckpoint, stop_if_asked
from gte_pro.launch.resume import (
    check_resumed_config,
    record_resolved,
    record_restart,
    remove_leftovers,
    restart_history,
    resume_checkpoint,
)
from gte_pro.mining.remine import RemineNegatives, remine_callback
from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build import (
    build_data_for,
    build_encoder,
    build_module,
    build_trainer,
    instantiate_dict,
    start_run,
)
from gte_pro.modes.handoff import after_reranker
from gte_pro.modes.prepare import prepare
from gte_pro.preflight.memory_budget import memory_record
from gte_pro.preflight.memory_estimate import MemoryPlan
from gte_pro.training.base_module import TrainingModule
from gte_pro.training.callbacks import DecontaminationRecord, Throughput, ValidationRecord
from gte_pro.training.lr_find import find_lr
from gte_pro.utils.files import write_json_atomic
from gte_pro.utils.plots import plot_run_logged
from gte_pro.utils.secrets import redact_secrets
from gte_pro.utils.timing import PhaseTimes

log = logging.getLogger(__name__)

VAL_BEFORE = "val_before.json"


def _best_checkpoint(trainer: Trainer) -> str | None:
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", "") if callback else ""
    return path or None


def _format(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))


@dataclass
class Run:
    """One ``mode=train`` run as ``set_up`` builds it: what trains on what, where it writes, and the callbacks whose
    records the summary reads."""

    cfg: DictConfig
    output_dir: Path
    module: TrainingModule
    datamodule: Any
    trainer: Trainer
    callbacks: list[Callback]
    loggers: list[Logger]
    ckpt_path: str | None  # the checkpoint it resumes from (None: a fresh start)
    config_changes: dict[str, Any]  # keys that differ from the config of the run it resumes
    validation: ValidationRecord
    throughput: Throughput | None
    remine: RemineNegatives | None
    times: PhaseTimes
    memory: MemoryPlan | None = None  # the estimate per device made before the model loaded


def fit(cfg: DictConfig) -> float | None:
    """Fit an encoder as ``cfg`` says; write ``metrics.json`` and ``model/``; return ``cfg.optimized_metric``."""
    times = PhaseTimes()
    with times.phase("setup"):
        run = set_up(cfg, times)
    with _wandb_run_closed(run.loggers):
        for lg in run.loggers:
            lg.log_hyperparams(redact_secrets(OmegaConf.to_container(cfg, resolve=True)))
        suggested_lr = find_lr(run.cfg, run.trainer, run.module, run.datamodule, run.output_dir, run.ckpt_path)
        with times.phase("validation before"):
            before = _validate_before(run)
        if before:
            optimized_value(before, cfg.get("optimized_metric"))  # a wrong name fails now, not after training
        with times.phase("training"):
            run.trainer.fit(run.module, datamodule=run.datamodule, ckpt_path=run.ckpt_path)
        stop_if_asked(run.trainer)  # a signal during the last steps, which had no boundary left to stop at
        train_metrics = {**run.module.train_metrics(), **(run.throughput.rates() if run.throughput else {})}
        best_ckpt = _best_checkpoint(run.trainer)
        with times.phase("validation after"):
            after = _validate_best(run, best_ckpt)
        # strategy=fsdp: the exports need the weights, not this rank's shards (a collective: every rank calls it)
        module = unsharded_module(run.trainer, run.module, lambda: build_module(cfg, build_encoder(cfg)))
        if run.trainer.is_global_zero:
            run = replace(run, module=module)
            _export_and_record(run, _summary(run, before, after, train_metrics, best_ckpt, suggested_lr))
    return optimized_value(after, cfg.get("optimized_metric"))


def set_up(cfg: DictConfig, times: PhaseTimes) -> Run:
    """Everything before the first validation: the run folder, resume decision, encoder, data, module, callbacks,
    loggers and trainer."""
    output_dir, resolution = start_run(cfg)
    remove_leftovers(output_dir)
    ckpt_path = resume_checkpoint(cfg.ckpt_path, cfg.resume, output_dir)
    config_changes = check_resumed_config(cfg, output_dir, ckpt_path)
    record_restart(output_dir, ckpt_path)
    if ckpt_path:  # continuing in a folder that holds checkpoints is the point, not a mistake to warn about
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    check_export_requirements(cfg.get("export"))

    remine = remine_callback(cfg, output_dir)
    # eval.beir: validated (and logged) next to the held-out split; data.remine: the pool the training rows draw from
    collaborators = {"eval_sets": eval_set_source(cfg), "negative_pool": remine.pool if remine is not None else None}
    # before the weights load, on the run's one data module (task=embed): a run that cannot fit stops here, with what
    # would fit; loss.mini_batch_size=auto is resolved here (and kept in the run folder for a resume)
    datamodule, decisions = prepare(cfg, output_dir, resumed=ckpt_path is not None, **collaborators)
    record_resolved(output_dir, {**resolution.record(), **decisions.record()})
    encoder = build_encoder(cfg)
    module = build_module(cfg, encoder)
    if datamodule is None:  # task=rerank: its data module joins the module's pairs and serves its candidates
        datamodule = build_data_for(cfg, module, **collaborators)
    _log_parameters(encoder)
    configured = instantiate_dict(cfg.get("callbacks"))
    validation = ValidationRecord()
    callbacks = [*configured, validation]
    callbacks.append(PreemptionCheckpoint(output_dir))  # SIGTERM/SIGINT (and submitit's preemption signal)
    callbacks.append(DecontaminationRecord(output_dir))  # data.decontaminate: <run dir>/decontamination.json
    if remine is not None:
        callbacks.append(remine)
    loggers = instantiate_dict(cfg.get("logger"))
    return Run(cfg=cfg, output_dir=output_dir, module=module, datamodule=datamodule,
               trainer=build_trainer(cfg, callbacks, loggers), callbacks=callbacks, loggers=loggers,
               ckpt_path=ckpt_path, config_changes=config_changes, validation=validation,
               throughput=next((cb for cb in configured if isinstance(cb, Throughput)), None), remine=remine,
               times=times, memory=decisions.memory)


@contextlib.contextmanager
def _wandb_run_closed(loggers: list[Logger]) -> Iterator[None]:
    """A sweep runs many jobs in one process: close each job's wandb run (marked failed when the job raised) so that
    the next job starts a run of its own instead of logging into this one."""
    failed = True
    try:
        yield
        failed = False
    finally:
        if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
            import wandb

            wandb.finish(exit_code=1 if failed else 0)


def _parameter_counts(encoder: Encoder) -> dict[str, int]:
    """All of the encoder's parameters (head and LoRA adapters included) and those the optimizer updates."""
    return {"total": sum(p.numel() for p in encoder.parameters()),
            "trainable": sum(p.numel() for p in encoder.parameters() if p.requires_grad)}


def _log_parameters(encoder: Encoder) -> None:
    counts = _parameter_counts(encoder)
    log.info("encoder: %.1f M parameters, %.3f M trainable", counts["total"] / 1e6, counts["trainable"] / 1e6)


def _validate_before(run: Run) -> dict[str, float] | None:
    """The untrained model's metrics: measured on a run's first start and kept in the run folder, so that a
    resumed run reports the same numbers as an uninterrupted one."""
    record = run.output_dir / VAL_BEFORE
    if not run.cfg.eval.before:
        return None  # eval.before=false: the untrained model's figures are not needed (a sweep measures them once)
    if run.ckpt_path:
        return json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
    before = merge_results(run.trainer.validate(run.module, datamodule=run.datamodule, verbose=False))
    log.info("validation before training: %s", _format(before))
    for line in saturation_warnings(before):
        log.warning("%s", line)
    if run.trainer.is_global_zero:
        write_json_atomic(record, before)
    return before


def _validate_best(run: Run, best_ckpt: str | None) -> dict[str, float]:
    """The metrics of the best checkpoint (no checkpointing: the last weights), whose weights the module holds after
    this call, for the exports. A checkpoint that was validated during this fit is loaded, not validated again."""
    if best_ckpt:
        checkpoint = torch.load(best_ckpt, map_location="cpu", mmap=True, weights_only=True)
        known = run.validation.by_step.get(checkpoint["global_step"])
        if known and not is_sharded(run.trainer):  # FSDP loads a checkpoint into its shards through Lightning
            run.module.load_state_dict(checkpoint["state_dict"])
            log.info("validation after training (%s): validated at step %d with the same weights: %s", best_ckpt,
                     checkpoint["global_step"], _format(known))
            return known
    after = merge_results(run.trainer.validate(run.module, datamodule=run.datamodule, ckpt_path=best_ckpt,
                                               verbose=False))
    log.info("validation after training (%s): %s", best_ckpt or "last weights", _format(after))
    return after


def _summary(run: Run, before: dict[str, float] | None, after: dict[str, float], train_metrics: dict[str, float],
             best_ckpt: str | None, suggested_lr: float | None) -> dict[str, Any]:
    """What ``metrics.json`` records of a finished fit (the exports and timings are added by ``_export_and_record``)."""
    return {
        "val_before": before,
        "val": after,
        "train": train_metrics,
        "best_checkpoint": best_ckpt,
        "global_step": run.trainer.global_step,
        "world_size": run.trainer.world_size,
        "resumed_from": run.ckpt_path,
        "restarts": restart_history(run.output_dir),  # every start that resumed, with its step and SLURM requeue
        "resume_config_changes": run.config_changes,
        "lr": run.module.lr,
        "parameters": _parameter_counts(run.module.encoder),
        "lr_find_suggestion": suggested_lr,
        "data": getattr(run.datamodule, "reports", []),
        # what the batches carried (data.num_negatives=null: the most any row of the file carries)
        "num_negatives": getattr(run.datamodule, "num_negatives", None),
        "remine": run.remine.costs if run.remine is not None else None,
        "decontamination": getattr(run.datamodule, "decontamination", None),  # data.decontaminate's report
        "memory": memory_record(run.memory),
        "below_val_before": below_val_before(before, after, run.cfg.get("optimized_metric"),
                                             DISTILL_LOSSES.get(str(OmegaConf.select(run.cfg, "loss._target_")))),
    }


def _export_and_record(run: Run, summary: dict[str, Any]) -> None:
    """Rank 0: ``model/`` and ``metrics.json`` first (a failing export check still leaves both), then the verified
    exports, model card and deployment checks, recorded in ``metrics.json`` with the run's wall-time breakdown."""
    cfg, output_dir, module, times = run.cfg, run.output_dir, run.module, run.times
    reranker = isinstance(module.encoder, CrossEncoder)
    with times.phase("exports"):
        export = export_cross_encoder if reranker else export_sentence_transformers
        model_dir = export(module.encoder, output_dir / "model")
        summary["model_dir"] = str(model_dir)
        if getattr(module.loss, "quantization_aware", ()) and module.loss.quantization_ranges.numel():
            summary["quantization_file"] = str(write_quantization(model_dir, module.loss.quantization_ranges,
                                                                  module.loss.quantization_aware))
        write_json_atomic(output_dir / "metrics.json", summary)
        # raises (failing the run) if an export does not reproduce the module
        summary["exports"] = (release_reranker if reranker else release)(module.encoder, output_dir, cfg, summary,
                                                                         fresh=lambda: build_encoder(cfg))
        plot_run_logged(output_dir)
    summary["timing"], summary["peak_rss_mb"] = times.record(), times.peak_rss_mb
    write_json_atomic(output_dir / "metrics.json", summary)
    below = f"WARNING: {summary['below_val_before']['note']}\n" if summary.get("below_val_before") else ""
    print(f"\n{times.line()}\n\n{metrics_table(summary['val'], summary['val_before'])}\n{below}"
          f"metrics: {output_dir / 'metrics.json'}\nmodel:   {model_dir}")
    if reranker:
        print(after_reranker(cfg, model_dir))
