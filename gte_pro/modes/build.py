"""Config -> objects: the one place where a composed Hydra config becomes an encoder, a data module, a Lightning
module, callbacks, loggers and a trainer. Every mode (``gte_pro.modes``: fit, evaluate, mine) starts with
``start_run`` and builds through these functions, as do the benchmarks, so a run is set up the same way wherever it
starts.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from hydra.utils import instantiate
from lightning.fabric import Fabric
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ProgressBar
from lightning.pytorch.loggers import Logger
from omegaconf import DictConfig, OmegaConf

from gte_pro.config.cross_keys import DISTILL_LOSSES, training_file
from gte_pro.config.resolve import Resolution, resolve
from gte_pro.errors import ConfigError
from gte_pro.launch.checkpoint_io import AtomicCheckpointIO
from gte_pro.launch.environment import cpu_has_native_bf16, emulated_bf16_warning
from gte_pro.models import model_options
from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build_data import build_datamodule
from gte_pro.scoring.teacher_file import loss_options
from gte_pro.training.base_module import TrainingModule
from gte_pro.training.callbacks import decide_before_last_checkpoint
from gte_pro.training.module import ContrastiveModule
from gte_pro.training.rerank_module import RerankModule

log = logging.getLogger(__name__)


def instantiate_dict(group: DictConfig | None) -> list[Any]:
    """Instantiate each ``_target_`` entry of a dict-valued group (callbacks, logger); ``none`` gives []."""
    if not group:
        return []
    return [instantiate(node) for node in group.values() if isinstance(node, DictConfig) and "_target_" in node]


# task=embed trains an embedder (model/: an Encoder), task=rerank a reranker (model/: a CrossEncoder)
TASKS: dict[str, tuple[type, type[TrainingModule]]] = {"embed": (Encoder, ContrastiveModule),
                                                       "rerank": (CrossEncoder, RerankModule)}


def task_of(cfg: DictConfig) -> str:
    task = cfg.task
    if task not in TASKS:
        raise ConfigError(f"task={task!r} is not valid; valid choices: {', '.join(TASKS)}")
    return task


def build_encoder(cfg: DictConfig) -> Any:
    """The network from ``cfg.model`` (everything but ``lr``, which belongs to the optimizer): an ``Encoder``, or
    for ``task=rerank`` a ``CrossEncoder``."""
    return instantiate(model_options(OmegaConf.to_container(cfg.model, resolve=True)))


def seed_and_precision(cfg: DictConfig) -> None:
    """Every run starts here: the seeded RNGs (data order, dropout, heads) and the fp32 matmul precision."""
    seed_everything(cfg.seed, workers=True, verbose=False)
    torch.set_float32_matmul_precision(cfg.matmul_precision)


def start_run(cfg: DictConfig) -> tuple[Path, Resolution]:
    """The first step of every mode: seeds and matmul precision (``seed_and_precision``), the run folder
    (``paths.output_dir``, made if missing) and what the config leaves to this machine and data, settled
    (``gte_pro.config.resolve``: one log line); returns the folder and that resolution."""
    seed_and_precision(cfg)
    output_dir = Path(cfg.paths.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    return output_dir, resolve(cfg)


def task_collaborators(module: TrainingModule) -> dict[str, Any]:
    """What a task's module hands its data module: a reranker's joining of (query, document) ids and the
    candidates its validation reranks; nothing for an embedder."""
    if isinstance(module, RerankModule):
        return {"pair_join": module.encoder.pairs, "candidates": module.validation_candidates}
    return {}


def _trained_on(cfg: DictConfig) -> dict[str, Any]:
    """A distillation loss's name when it trains on the data module's rows (mode=eval only validates), so that rows
    without teacher scores or negatives are refused once read."""
    if cfg.mode != "train":
        return {}
    return {"distill_loss": DISTILL_LOSSES.get(str(cfg.loss._target_))}


def build_data_for(cfg: DictConfig, module: TrainingModule, **collaborators: Any) -> Any:
    """The data module for ``module``'s task (a reranker's batches are its own joined pairs, its validation sets
    its candidates), with ``collaborators`` (``negative_pool``, ``eval_sets``) besides."""
    encoder = module.encoder
    return build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix,
                            **task_collaborators(module), **_trained_on(cfg), **collaborators)


def embedder_tokenizer(cfg: DictConfig) -> Any:
    """The tokenizer ``build_encoder`` loads for ``task=embed`` (``Encoder.load``: the same files, the same
    preparation, so the same token cache key), without the weights."""
    from gte_pro.models.loading import check_trust_remote_code, load_tokenizer, prepare_tokenizer

    model = cfg.model
    check_trust_remote_code(model.trust_remote_code)
    tokenizer = load_tokenizer(str(model.name_or_path), model.trust_remote_code)
    prepare_tokenizer(tokenizer, model.padding_side, model.append_eos)
    return tokenizer


def build_data_before_model(cfg: DictConfig, **collaborators: Any) -> Any | None:
    """``task=embed``: the run's data module, built before the encoder from the tokenizer the encoder will load
    (no weights), so that the pre-flight reads its token cache and the run then trains on it. None for
    ``task=rerank``, whose data module joins the cross-encoder's pairs and serves its module's validation
    candidates: ``build_data_for``, once the module exists."""
    if task_of(cfg) != "embed":
        return None
    return build_datamodule(cfg, embedder_tokenizer(cfg), cfg.model.query_prefix, cfg.model.doc_prefix,
                            **_trained_on(cfg), **collaborators)


def build_strategy(cfg: DictConfig) -> Any:
    """``strategy/auto`` is a name for Lightning; the others are strategy objects built from their config."""
    if "_target_" in cfg.strategy:
        return instantiate(cfg.strategy)
    return cfg.strategy.name


# keys of conf/trainer/ that gte_pro reads itself (gte_pro.preflight.memory_budget), not Trainer(...) options
GTE_PRO_TRAINER_KEYS = ("memory_budget",)


def build_trainer(cfg: DictConfig, callbacks: list[Callback], loggers: list[Logger]) -> Trainer:
    if not loggers:  # logger=none: the learning-rate monitor has nowhere to write and Lightning refuses it
        callbacks = [cb for cb in callbacks if not isinstance(cb, LearningRateMonitor)]
    callbacks = decide_before_last_checkpoint(callbacks)
    options: dict[str, Any] = {}
    if "enable_progress_bar" not in cfg.trainer:
        # callbacks.progress_bar=null means no bar, not Lightning's default one (in a SLURM log it is only noise;
        # the Throughput callback logs progress lines instead)
        options["enable_progress_bar"] = any(isinstance(cb, ProgressBar) for cb in callbacks)
    # every checkpoint (last, best, preemption) is written atomically and read back with weights_only=True
    lightning_options = {key: value for key, value in cfg.trainer.items() if key not in GTE_PRO_TRAINER_KEYS}
    trainer = instantiate(lightning_options, callbacks=callbacks, logger=loggers or False,
                          strategy=build_strategy(cfg), plugins=[AtomicCheckpointIO()], **options)
    warning = emulated_bf16_warning(cfg.trainer.precision, isinstance(trainer.accelerator, CPUAccelerator),
                                    cpu_has_native_bf16())
    if warning and trainer.is_global_zero:
        log.warning(warning)
    return trainer


# strategy/ options that name a Trainer's strategy class -> Fabric's class with the same options
FABRIC_STRATEGIES = {"lightning.pytorch.strategies.DDPStrategy": "lightning.fabric.strategies.DDPStrategy"}


def build_fabric(cfg: DictConfig) -> Fabric:
    """A Lightning Fabric for the modes that train nothing (mine, score): the trainer's accelerator, devices, nodes
    and precision, and the same strategy (strategy=ddp: Fabric's DDP with the same options), so Lightning's
    connector finds the cluster environment (SLURM, torchrun, ...) and starts DDP's other ranks as the Trainer does
    (``gte_pro.launch.relaunch`` under Hydra). ``fabric.launch()`` starts them."""
    strategy: Any = cfg.strategy.get("name")  # strategy=auto names one; ddp and fsdp give a _target_
    if "_target_" in cfg.strategy:
        target = FABRIC_STRATEGIES.get(cfg.strategy._target_)
        if target is None:
            raise ConfigError(f"mode={cfg.mode}: strategy {cfg.strategy._target_} is not supported (every "
                              "rank embeds or scores with the whole weights); use strategy=ddp")
        strategy = instantiate(cfg.strategy, _target_=target)
    deterministic = cfg.trainer.get("deterministic")
    if deterministic is not None:  # as Trainer(deterministic=...) sets it
        torch.use_deterministic_algorithms(bool(deterministic), warn_only=deterministic == "warn")
    fabric = Fabric(accelerator=cfg.trainer.accelerator, devices=cfg.trainer.devices, num_nodes=cfg.trainer.num_nodes,
                    precision=cfg.trainer.precision, strategy=strategy)
    warning = emulated_bf16_warning(cfg.trainer.precision, fabric.device.type == "cpu",
                                    cpu_has_native_bf16())
    if warning and fabric.is_global_zero:
        log.warning(warning)
    return fabric


def on_device(fabric: Fabric, module: torch.nn.Module) -> Any:
    """``module`` in ``fabric``'s precision (bf16-true, ...) and on its device, as ``Trainer.validate`` prepares a
    module (nothing trains: no DDP wrapper)."""
    return fabric.to_device(fabric.strategy.precision.convert_module(module))


def module_config(cfg: DictConfig) -> dict[str, Any]:
    """The resolved parts of ``cfg`` that describe the Lightning module (saved with every checkpoint); the loss's
    ``teacher_temperature`` as a number (a run settled ``auto`` at its start, ``gte_pro.config.resolve``; for a
    config built without a run, ``loss_options`` reads the training file's teacher record)."""
    config = {key: OmegaConf.to_container(cfg[key], resolve=True) if OmegaConf.is_config(cfg[key]) else cfg[key]
              for key in TrainingModule.CONFIG_KEYS if key in cfg}
    if isinstance(config.get("loss"), dict):
        config["loss"] = loss_options(config["loss"], training_file(cfg))
        if config["loss"].get("mini_batch_size") == "auto":  # unresolved (mode=eval: no step to size): no GradCache
            config["loss"]["mini_batch_size"] = None
    return config


def build_module(cfg: DictConfig, encoder: Encoder | CrossEncoder) -> TrainingModule:
    """The task's Lightning module around ``encoder``, which must be the task's kind of model."""
    task = task_of(cfg)
    model_class, module_class = TASKS[task]
    if not isinstance(encoder, model_class):
        valid = {"embed": "an embedder (model=minilm, gte_small, encoder, ...)",
                 "rerank": "a cross-encoder (model=reranker_minilm, reranker_tiny, cross_encoder, ...)"}[task]
        raise ConfigError(f"task={task} trains {valid}; model={cfg.model._target_} is a "
                         f"{type(encoder).__name__}")
    return module_class.from_config(module_config(cfg), encoder)
