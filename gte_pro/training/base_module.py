"""What every gte-pro Lightning module shares, the embedder's (``gte_pro.training.module``) and the reranker's
(``gte_pro.training.rerank_module``): building from a run's config parts (saved with every checkpoint), the per-step
seeding that makes a resumed run draw what an uninterrupted one draws, the non-finite guard around each optimizer
step, the training metrics, and the optimizer with its schedule."""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule
from torch import nn

from gte_pro.errors import ResumeError
from gte_pro.training.guard import NonFiniteGuard
from gte_pro.training.losses import LossOutput
from gte_pro.utils.progress import logs_this_step

CONFIG_KEY = "gte_pro_module_config"


def param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Weight decay (the optimizer's own setting) on matrices only; biases and LayerNorm gains get none."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


def build_scheduler(factory: Callable[..., Any], optimizer: torch.optim.Optimizer, warmup_ratio: float,
                    total_steps: int) -> Any:
    """A transformers-style schedule: warmup over ``warmup_ratio`` of ``total_steps``, then the factory's decay
    (constant schedules take no ``num_training_steps``)."""
    kwargs: dict[str, Any] = {"num_warmup_steps": int(warmup_ratio * total_steps)}
    if "num_training_steps" in inspect.signature(factory).parameters:
        kwargs["num_training_steps"] = total_steps
    return factory(optimizer, **kwargs)


class TrainingModule(LightningModule):
    """The shared part; a subclass adds its ``training_step`` and validation, and may take more constructor
    arguments from the config (``options_from_config``)."""

    # the config groups a module is built from (``from_config``), saved with every checkpoint
    CONFIG_KEYS = ("model", "loss", "optimizer", "scheduler", "seed", "eval")

    def __init__(
        self,
        encoder: nn.Module,
        loss: nn.Module,
        optimizer: Callable[..., torch.optim.Optimizer],
        lr: float,
        scheduler: Callable[..., Any] | None = None,
        warmup_ratio: float = 0.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.encoder = encoder  # the network that trains: the embedder, or the reranker (task=rerank)
        self.seed = seed
        self._train_metrics: dict[str, torch.Tensor] = {}  # the last step's, detached (read at checkpoints and end)
        self.loss = loss
        # skips optimizer steps with a NaN/inf loss or gradient norm (gte_pro.training.guard), up to
        # loss.max_skipped_steps
        self.guard = NonFiniteGuard(getattr(loss, "max_skipped_steps", 10))
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.warmup_ratio = warmup_ratio
        self.lr = lr  # a plain attribute, so that Lightning's learning-rate finder can set it
        # the config parts it was built from (gte_pro.modes.build.build_module), saved with every checkpoint
        self.module_config: dict[str, Any] = {}

    @classmethod
    def options_from_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        """Constructor arguments beyond the shared ones, read from the config parts."""
        return {}

    @classmethod
    def from_config(cls, config: dict[str, Any], encoder: nn.Module | None = None) -> Any:
        """The module that a run's resolved config parts (``CONFIG_KEYS``) describe; ``encoder``: one already built
        from ``config["model"]`` (None: build it). The parts are kept and saved with every checkpoint."""
        from hydra.utils import instantiate

        if encoder is None:
            from gte_pro.models import model_options

            encoder = instantiate(model_options(config["model"]))
        scheduler = config.get("scheduler")
        module = cls(
            encoder=encoder,
            loss=instantiate(config["loss"]),
            optimizer=instantiate(config["optimizer"]),
            lr=config["model"]["lr"],
            scheduler=instantiate(scheduler["fn"]) if scheduler else None,
            warmup_ratio=scheduler["warmup_ratio"] if scheduler else 0.0,
            seed=config["seed"],
            **cls.options_from_config(config),
        )
        module.module_config = config
        return module

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, map_location: Any = "cpu",  # type: ignore[override]
                             **_: Any) -> Any:
        """The module of a gte-pro checkpoint (``<run>/checkpoints/*.ckpt``), rebuilt from the config it carries:
        encoder (with the checkpoint's weights), loss and optimizer settings. Read with ``weights_only=True``."""
        checkpoint = torch.load(checkpoint_path, map_location=map_location, weights_only=True)
        config = checkpoint.get(CONFIG_KEY)
        if not config:
            raise ResumeError(f"{checkpoint_path}: this checkpoint carries no '{CONFIG_KEY}' (written by gte-pro "
                             "before load_from_checkpoint existed); resume its run instead: python train.py "
                             "ckpt_path=...")
        module = cls.from_config(config)
        module.load_state_dict(checkpoint["state_dict"])
        module.on_load_checkpoint(checkpoint)
        return module

    # --- training ---------------------------------------------------------------------------------------------
    def on_fit_start(self) -> None:
        if getattr(self, "_resumed_stopped", False):  # restored after the checkpoint: fit ends where it had stopped
            self.trainer.should_stop = True
            self._resumed_stopped = False

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # dropout (and any other draw) of a step depends on (seed, epoch, batch, rank) alone, not on what ran
        # before: a run resumed mid-epoch draws exactly what the uninterrupted run drew, with no RNG state to save
        step_seed = ((self.seed * 1_000_003 + self.current_epoch) * 1_000_003 + batch_idx) * 1_009 + self.global_rank
        step_seed %= 2**32
        random.seed(step_seed)
        np.random.seed(step_seed)
        torch.manual_seed(step_seed)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        # runs the closure, then steps only when every loss and the gradient norm are finite (gte_pro.training.guard)
        self.guard.step(self, optimizer, optimizer_closure or (lambda: None))

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        model = self._trainer.model if self._trainer is not None else None
        if gradient_clip_val and isinstance(model, FullyShardedDataParallel) and gradient_clip_algorithm != "value":
            # each rank holds a shard of the gradients: FSDP's own clip reduces their norm over the ranks (Lightning's
            # FSDP precision refuses norm clipping)
            model.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)

    def _log_train_metrics(self, out: LossOutput, batch_size: int) -> None:
        scores = out.scores.float()
        positive_scores = scores.gather(1, out.labels[:, None])
        negative_mean = (scores.sum() - positive_scores.sum()) / max(scores.numel() - batch_size, 1)
        metrics = {
            "train/loss": out.loss,
            "train/acc": (scores.argmax(1) == out.labels).float().mean(),
            "train/sim_pos": positive_scores.mean(),
            "train/sim_neg": negative_mean,
        }
        self._train_metrics = {name: value.detach() for name, value in metrics.items()}
        if logs_this_step(self._trainer):
            self.log_dict(metrics, prog_bar=True, batch_size=batch_size)

    def train_metrics(self) -> dict[str, float]:
        """This rank's metrics of the last training step (restored from the checkpoint by a resumed run)."""
        return {name: float(value) for name, value in self._train_metrics.items()}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["gte_pro_train_metrics"] = self.train_metrics()
        checkpoint[CONFIG_KEY] = self.module_config
        checkpoint["gte_pro_guard"] = self.guard.state_dict()  # a resumed run counts on towards the same limit
        # Lightning does not save a stop decision (early stopping): a run killed after it would train on
        checkpoint["gte_pro_should_stop"] = bool(self._trainer is not None and self.trainer.should_stop)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint.get("gte_pro_train_metrics", {})
        self._train_metrics = {name: torch.tensor(value) for name, value in saved.items()}
        self.guard.load_state_dict(checkpoint.get("gte_pro_guard", {}))
        self._resumed_stopped = bool(checkpoint.get("gte_pro_should_stop", False))

    # --- validation ------------------------------------------------------------------------------------------
    def _log_mean_over_sets(self, by_set: dict[str, dict[str, float]]) -> None:
        """data=mix has no unnamed held-out set: val/<metric> (the monitored val/ndcg@10) is the unweighted mean
        over the sets the data module names in ``averaged_sets`` (its sources), each logged as val/<source>/..."""
        names = getattr(self.trainer.datamodule, "averaged_sets", None)
        if not names:
            return
        for metric in by_set[names[0]]:
            mean = sum(by_set[name][metric] for name in names) / len(names)
            self.log("val/" + metric, mean, prog_bar=metric == "ndcg@10", sync_dist=False, add_dataloader_idx=False)

    # --- optimisation ---------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(param_groups(self.encoder), lr=self.lr)
        if self.scheduler_factory is None:
            return optimizer
        total_steps = int(self.trainer.estimated_stepping_batches)
        scheduler = build_scheduler(self.scheduler_factory, optimizer, self.warmup_ratio, total_steps)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
