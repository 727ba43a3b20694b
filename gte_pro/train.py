"""``train(cfg)``: build everything from the Hydra config, validate, fit, validate the best model, export.

``train.py`` at the repository root is a thin ``@hydra.main`` wrapper around this function; the tests call it
with configs made by Hydra's compose API.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from gte_pro.data.beir import attach_eval_sets
from gte_pro.export import export_sentence_transformers
from gte_pro.launch import job_scope, preemption_callback, resume_checkpoint, under_submitit
from gte_pro.model import Encoder
from gte_pro.module import ContrastiveModule
from gte_pro.release import check_export_requirements, release

log = logging.getLogger(__name__)


def instantiate_dict(group: DictConfig | None) -> list[Any]:
    """Instantiate each ``_target_`` entry of a dict-valued group (callbacks, logger); ``none`` gives []."""
    if not group:
        return []
    return [instantiate(node) for node in group.values() if isinstance(node, DictConfig) and "_target_" in node]


def build_encoder(cfg: DictConfig) -> Encoder:
    """The encoder from ``cfg.model`` (everything but ``lr``, which belongs to the optimizer)."""
    options = {key: value for key, value in OmegaConf.to_container(cfg.model, resolve=True).items() if key != "lr"}
    return instantiate(options)


def seed_and_precision(cfg: DictConfig) -> None:
    """Every run starts here: the seeded RNGs (data order, dropout, heads) and the fp32 matmul precision."""
    seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision(cfg.get("matmul_precision", "high"))


def build_datamodule(cfg: DictConfig, tokenizer: Any, query_prefix: str = "", doc_prefix: str = "") -> Any:
    """The configured data module (``data/``), tokenizing with ``tokenizer`` and the model's prompts."""
    return instantiate(cfg.data, tokenizer=tokenizer, query_prefix=query_prefix, doc_prefix=doc_prefix,
                       seed=cfg.seed)


def build_strategy(cfg: DictConfig) -> Any:
    """``strategy/auto`` is a name for Lightning; the others are strategy objects built from their config."""
    if "_target_" in cfg.strategy:
        return instantiate(cfg.strategy)
    return cfg.strategy.name


def build_trainer(cfg: DictConfig, callbacks: list[Callback], loggers: list[Logger]) -> Trainer:
    if not loggers:  # logger=none: the learning-rate monitor has nowhere to write and Lightning refuses it
        callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    overrides: dict[str, Any] = {}
    if cfg.loss.get("mini_batch_size"):
        # the cached loss optimises by hand (ContrastiveModule), where Lightning refuses Trainer(gradient_clip_val):
        # the module clips with the same value instead (build_module passes it)
        overrides["gradient_clip_val"] = None
        if (cfg.trainer.get("accumulate_grad_batches") or 1) > 1:
            raise ValueError("loss.mini_batch_size (GradCache) and trainer.accumulate_grad_batches > 1 do not combine: "
                             "raise data.batch_size instead (the cached loss keeps its memory at mini_batch_size)")
    return instantiate(cfg.trainer, callbacks=callbacks, logger=loggers or False, strategy=build_strategy(cfg),
                       **overrides)


def build_module(cfg: DictConfig, encoder: Encoder) -> ContrastiveModule:
    scheduler = cfg.get("scheduler")
    return ContrastiveModule(
        encoder=encoder,
        loss=instantiate(cfg.loss),
        optimizer=instantiate(cfg.optimizer),
        lr=cfg.model.lr,
        scheduler=instantiate(scheduler.fn) if scheduler else None,
        warmup_ratio=scheduler.warmup_ratio if scheduler else 0.0,
        # used only by the cached loss's manual optimisation (automatic optimisation clips in the Trainer)
        gradient_clip_val=cfg.trainer.get("gradient_clip_val"),
        gradient_clip_algorithm=cfg.trainer.get("gradient_clip_algorithm") or "norm",
    )


def run_lr_find(trainer: Trainer, module: ContrastiveModule, datamodule: Any, output_dir: Path,
                num_training: int = 100) -> float:
    """Lightning's learning-rate range test; saves the plot and sets the module's lr to the suggestion.

    The whole sweep is recorded (no early stop on divergence): the suggestion needs the full curve.
    """
    from lightning.pytorch.tuner import Tuner

    if trainer.world_size > 1:
        raise ValueError("lr_find=true runs on one device: drop strategy=ddp/devices>1 for the search, "
                         "then train with the suggested model.lr")
    finder = Tuner(trainer).lr_find(module, datamodule=datamodule, update_attr=True, attr_name="lr",
                                    num_training=num_training, early_stop_threshold=None)
    if finder is None or finder.suggestion() is None:
        raise RuntimeError("the learning-rate finder produced no suggestion (loss curve too short or flat)")
    figure = finder.plot(suggest=True)
    figure.savefig(output_dir / "lr_find.png")
    log.info("lr_find: suggested lr %.3g (plot: %s)", finder.suggestion(), output_dir / "lr_find.png")
    return float(finder.suggestion())


def _metrics(results: list[dict[str, float]] | None) -> dict[str, float]:
    # one dict per validation dataloader (the held-out split, then each eval.beir set): merge them
    return {key: float(value) for result in results or [] for key, value in result.items()}


def _best_checkpoint(trainer: Trainer) -> str | None:
    callback = trainer.checkpoint_callback
    path = getattr(callback, "best_model_path", "") if callback else ""
    return path or None


def _finish_wandb(loggers: list[Logger]) -> None:
    """A sweep runs many jobs in one process: close each job's wandb run so the next starts a new one."""
    if any(type(lg).__name__ == "WandbLogger" for lg in loggers):
        import wandb

        wandb.finish()


def train(cfg: DictConfig) -> float | None:
    """Fit an encoder as ``cfg`` says; write ``metrics.json`` and ``model/``; return ``cfg.optimized_metric``.

    Each call is one job with its own distributed environment, so that sweeps can run many in one process.
    """
    mode = cfg.get("mode", "train")
    if mode not in ("train", "eval"):
        raise ValueError(f"mode={mode!r} is not valid; valid choices: train, eval")
    with job_scope(cfg.devices):
        if mode == "eval":
            from gte_pro.evaluate import evaluate  # evaluate imports this module's builders

            return evaluate(cfg)
        return _fit_and_export(cfg)


def _fit_and_export(cfg: DictConfig) -> float | None:
    seed_and_precision(cfg)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    ckpt_path = resume_checkpoint(cfg.get("ckpt_path"), cfg.get("resume", "auto"), output_dir)
    check_export_requirements(cfg.get("export"))

    encoder = build_encoder(cfg)
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    attach_eval_sets(datamodule, cfg)  # eval.beir: validated (and logged) next to the held-out split
    module = build_module(cfg, encoder)
    callbacks = instantiate_dict(cfg.get("callbacks"))
    if under_submitit():
        callbacks.append(preemption_callback()(output_dir))
    loggers = instantiate_dict(cfg.get("logger"))
    trainer = build_trainer(cfg, callbacks, loggers)
    for lg in loggers:
        lg.log_hyperparams(OmegaConf.to_container(cfg, resolve=True))

    suggested_lr = None
    if cfg.get("lr_find"):
        suggested_lr = run_lr_find(trainer, module, datamodule, output_dir, cfg.get("lr_find_steps", 100))
    before = None
    if not ckpt_path:  # a resumed run was measured before its first start
        before = _metrics(trainer.validate(module, datamodule=datamodule, verbose=False))
        log.info("validation before training: %s", _format(before))
    trainer.fit(module, datamodule=datamodule, ckpt_path=ckpt_path)
    train_metrics = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    best_ckpt = _best_checkpoint(trainer)
    after = _metrics(trainer.validate(module, datamodule=datamodule, ckpt_path=best_ckpt, verbose=False))
    log.info("validation after training (%s): %s", best_ckpt or "last weights", _format(after))

    if trainer.is_global_zero:
        model_dir = export_sentence_transformers(module.encoder, output_dir / "model")
        summary = {
            "val_before": before,
            "val": after,
            "train": train_metrics,
            "best_checkpoint": best_ckpt,
            "model_dir": str(model_dir),
            "global_step": trainer.global_step,
            "world_size": trainer.world_size,
            "resumed_from": ckpt_path,
            "lr": module.lr,
            "lr_find_suggestion": suggested_lr,
            "data": getattr(datamodule, "reports", []),
        }
        _write_json_atomic(output_dir / "metrics.json", summary)
        # verified exports, model card, deployment checks: raises (failing the run) if an export is off
        summary["exports"] = release(module.encoder, output_dir, cfg, summary, fresh=lambda: build_encoder(cfg))
        _write_json_atomic(output_dir / "metrics.json", summary)
        print(f"metrics: {output_dir / 'metrics.json'}\nmodel:   {model_dir}")
    _finish_wandb(loggers)
    metric = cfg.get("optimized_metric")
    return after.get(metric) if metric else None


def _format(metrics: dict[str, float]) -> str:
    return " ".join(f"{k}={v:.4f}" for k, v in sorted(metrics.items()))


def _write_json_atomic(path: Path, blob: dict[str, Any]) -> None:
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(blob, indent=2) + "\n")
    tmp.replace(path)
