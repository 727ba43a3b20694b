"""``mode=train``: build everything from the config, validate, fit, validate the best model, export.

Writes ``<run dir>/metrics.json`` and ``<run dir>/model/`` (plus the exports of ``export/``) on rank 0.
"""

from __future__ import annotations

import json
import logging
import warnings
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Trainer
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from gte_pro.builders import (
    build_datamodule,
    build_encoder,
    build_module,
    build_trainer,
    instantiate_dict,
    seed_and_precision,
)
from gte_pro.callbacks import Throughput, ValidationRecord
from gte_pro.errors import ConfigError
from gte_pro.evaluation.report import merge_results, metrics_table, optimized_value
from gte_pro.evaluation.sets import attach_eval_sets
from gte_pro.export.release import check_export_requirements, release
from gte_pro.export.writers import export_sentence_transformers
from gte_pro.launch.preemption import PreemptionCheckpoint, under_submitit
from gte_pro.launch.resume import check_resumed_config, resume_checkpoint
from gte_pro.mining.remine import RemineNegatives, remine_callback
from gte_pro.model import Encoder
from gte_pro.module import ContrastiveModule
from gte_pro.plots import plot_run
from gte_pro.utils.files import remove_stale_temporaries, write_json_atomic
from gte_pro.utils.secrets import redact_secrets
from gte_pro.utils.timing import PhaseTimes

log = logging.getLogger(__name__)

VAL_BEFORE = "val_before.json"


def run_lr_find(trainer: Trainer, module: ContrastiveModule, datamodule: Any, output_dir: Path,
                num_training: int = 100) -> float:
    """Lightning's learning-rate range test; saves the plot and sets the module's lr to the suggestion.

    The whole sweep is recorded (no early stop on divergence): the suggestion needs the full curve.
    """
    from lightning.pytorch.tuner import Tuner

    if trainer.world_size > 1:
        raise ConfigError("lr_find=true runs on one device: drop strategy=ddp/devices>1 for the search, "
                         "then train with the suggested model.lr")
    finder = Tuner(trainer).lr_find(module, datamodule=datamodule, update_attr=True, attr_name="lr",
                                    num_training=num_training, early_stop_threshold=None)
    if finder is None or finder.suggestion() is None:
        raise RuntimeError("the learning-rate finder produced no suggestion (loss curve too short or flat)")
    figure = finder.plot(suggest=True)
    figure.savefig(output_dir / "lr_find.png")
    log.info("lr_find: suggested lr %.3g (plot: %s)", finder.suggestion(), output_dir / "lr_find.png")
    return float(finder.suggestion())


def _best_checkpoint(trainer: Trainer) -> str | None:
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", "") if callback else ""
    return path or None


def _finish_wandb(loggers: list[Logger], failed: bool) -> None:
    """A sweep runs many jobs in one process: close each job's wandb run (marked failed when the job raised) so that
    the next job starts a run of its own instead of logging into this one."""
    if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
        import wandb

        wandb.finish(exit_code=1 if failed else 0)


def _remove_leftovers(output_dir: Path) -> None:
    """Rank 0: temporary files of a killed earlier start (a checkpoint, an export half written) go first."""
    if rank_zero_only.rank != 0:
        return
    for folder in (output_dir, output_dir / "checkpoints"):
        for path in remove_stale_temporaries(folder):
            log.info("removed %s, left by a run that was killed while writing it", path)


def _format(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))


def fit(cfg: DictConfig) -> float | None:
    """Fit an encoder as ``cfg`` says; write ``metrics.json`` and ``model/``; return ``cfg.optimized_metric``."""
    times = PhaseTimes()
    with times.phase("setup"):
        module, datamodule, callbacks, loggers, ckpt_path, config_changes = _set_up(cfg)
    output_dir = Path(cfg.paths.output_dir)
    failed = True
    try:
        after = _fit_validate_export(cfg, output_dir, module, datamodule, callbacks, loggers, ckpt_path,
                                     config_changes, times)
        failed = False
    finally:
        _finish_wandb(loggers, failed)
    return optimized_value(after, cfg.get("optimized_metric"))


def _set_up(cfg: DictConfig) -> tuple[ContrastiveModule, Any, list[Any], list[Logger], str | None, dict[str, Any]]:
    """Everything before the first validation: the run folder, resume decision, encoder, data, module, callbacks,
    loggers."""
    seed_and_precision(cfg)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(output_dir)
    ckpt_path = resume_checkpoint(cfg.get("ckpt_path"), cfg.get("resume", "auto"), output_dir)
    config_changes = check_resumed_config(cfg, output_dir, ckpt_path)
    if ckpt_path:  # continuing in a folder that holds checkpoints is the point, not a mistake to warn about
        warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    check_export_requirements(cfg.get("export"))

    encoder = build_encoder(cfg)
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    attach_eval_sets(datamodule, cfg)  # eval.beir: validated (and logged) next to the held-out split
    module = build_module(cfg, encoder)
    _log_parameters(encoder)
    callbacks = [*instantiate_dict(cfg.get("callbacks")), ValidationRecord()]
    if under_submitit():
        callbacks.append(PreemptionCheckpoint(output_dir))
    remine = remine_callback(cfg, output_dir)
    if remine is not None:
        callbacks.append(remine)
    loggers = instantiate_dict(cfg.get("logger"))
    return module, datamodule, callbacks, loggers, ckpt_path, config_changes


def _plot_curves(output_dir: Path) -> None:
    """``curves.png`` from the CSV log; a plotting failure is reported, not allowed to fail a finished run."""
    try:
        path = plot_run(output_dir)
    except Exception as error:  # noqa: BLE001 - the run's results are saved; the picture is a convenience
        log.error("curves.png not written: %s: %s", type(error).__name__, error)
        return
    if path is not None:
        log.info("training curves: %s", path)


def _parameter_counts(encoder: Encoder) -> dict[str, int]:
    """All of the encoder's parameters (head and LoRA adapters included) and those the optimizer updates."""
    return {"total": sum(p.numel() for p in encoder.parameters()),
            "trainable": sum(p.numel() for p in encoder.parameters() if p.requires_grad)}


def _log_parameters(encoder: Encoder) -> None:
    counts = _parameter_counts(encoder)
    log.info("encoder: %.1f M parameters, %.3f M trainable", counts["total"] / 1e6, counts["trainable"] / 1e6)


def _validate_before(cfg: DictConfig, trainer: Trainer, module: ContrastiveModule, datamodule: Any,
                     output_dir: Path, ckpt_path: str | None) -> dict[str, float] | None:
    """The untrained model's metrics: measured on a run's first start and kept in the run folder, so that a
    resumed run reports the same numbers as an uninterrupted one."""
    record = output_dir / VAL_BEFORE
    if not OmegaConf.select(cfg, "eval.before", default=True):
        return None  # eval.before=false: the untrained model's figures are not needed (a sweep measures them once)
    if ckpt_path:
        return json.loads(record.read_text(encoding="utf-8")) if record.is_file() else None
    before = merge_results(trainer.validate(module, datamodule=datamodule, verbose=False))
    log.info("validation before training: %s", _format(before))
    if trainer.is_global_zero:
        write_json_atomic(record, before)
    return before


def _validate_best(trainer: Trainer, module: ContrastiveModule, datamodule: Any, best_ckpt: str | None,
                   record: ValidationRecord) -> dict[str, float]:
    """The metrics of the best checkpoint (no checkpointing: the last weights), whose weights the module holds after
    this call, for the exports. A checkpoint that was validated during this fit is loaded, not validated again."""
    if best_ckpt:
        checkpoint = torch.load(best_ckpt, map_location="cpu", mmap=True, weights_only=True)
        known = record.by_step.get(checkpoint["global_step"])
        if known:
            module.load_state_dict(checkpoint["state_dict"])
            log.info("validation after training (%s): validated at step %d with the same weights: %s", best_ckpt,
                     checkpoint["global_step"], _format(known))
            return known
    after = merge_results(trainer.validate(module, datamodule=datamodule, ckpt_path=best_ckpt, verbose=False))
    log.info("validation after training (%s): %s", best_ckpt or "last weights", _format(after))
    return after


def _fit_validate_export(cfg: DictConfig, output_dir: Path, module: ContrastiveModule, datamodule: Any,
                         callbacks: list[Any], loggers: list[Logger], ckpt_path: str | None,
                         config_changes: dict[str, Any], times: PhaseTimes) -> dict[str, float]:
    """Validate, fit, validate the best checkpoint; on rank 0 export and write metrics.json. The final metrics."""
    trainer = build_trainer(cfg, callbacks, loggers)
    for lg in loggers:
        lg.log_hyperparams(redact_secrets(OmegaConf.to_container(cfg, resolve=True)))

    suggested_lr = None
    if cfg.get("lr_find") and ckpt_path:
        log.info("lr_find: skipped, the run resumes from %s with its optimizer's learning rate", ckpt_path)
    elif cfg.get("lr_find"):
        suggested_lr = run_lr_find(trainer, module, datamodule, output_dir, cfg.get("lr_find_steps", 100))
    with times.phase("validation before"):
        before = _validate_before(cfg, trainer, module, datamodule, output_dir, ckpt_path)
    if before:
        optimized_value(before, cfg.get("optimized_metric"))  # a wrong name fails now, not after training
    with times.phase("training"):
        trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    rates = next((cb.rates() for cb in callbacks if isinstance(cb, Throughput)), {})
    train_metrics = {**module.train_metrics(), **rates}
    best_ckpt = _best_checkpoint(trainer)
    with times.phase("validation after"):
        record = next(cb for cb in callbacks if isinstance(cb, ValidationRecord))
        after = _validate_best(trainer, module, datamodule, best_ckpt, record)

    if trainer.is_global_zero:
        _export_and_record(cfg, output_dir, module, {
            "val_before": before,
            "val": after,
            "train": train_metrics,
            "best_checkpoint": best_ckpt,
            "global_step": trainer.global_step,
            "world_size": trainer.world_size,
            "resumed_from": ckpt_path,
            "resume_config_changes": config_changes,
            "lr": module.lr,
            "parameters": _parameter_counts(module.encoder),
            "lr_find_suggestion": suggested_lr,
            "data": getattr(datamodule, "reports", []),
            "remine": next((cb.costs for cb in callbacks if isinstance(cb, RemineNegatives)), None),
        }, times)
    return after


def _export_and_record(cfg: DictConfig, output_dir: Path, module: ContrastiveModule, summary: dict[str, Any],
                       times: PhaseTimes) -> None:
    """Rank 0: ``model/`` and ``metrics.json`` first (a failing export check still leaves both), then the verified
    exports, model card and deployment checks, recorded in ``metrics.json`` with the run's wall-time breakdown."""
    with times.phase("exports"):
        model_dir = export_sentence_transformers(module.encoder, output_dir / "model")
        summary["model_dir"] = str(model_dir)
        write_json_atomic(output_dir / "metrics.json", summary)
        # raises (failing the run) if an export does not reproduce the module
        summary["exports"] = release(module.encoder, output_dir, cfg, summary, fresh=lambda: build_encoder(cfg))
        _plot_curves(output_dir)
    summary["timing"], summary["peak_rss_mb"] = times.record(), times.peak_rss_mb
    write_json_atomic(output_dir / "metrics.json", summary)
    print(f"\n{times.line()}\n\n{metrics_table(summary['val'], summary['val_before'])}\n"
          f"metrics: {output_dir / 'metrics.json'}\nmodel:   {model_dir}")
