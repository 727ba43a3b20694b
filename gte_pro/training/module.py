"""The Lightning module: contrastive training steps and retrieval validation."""

from __future__ import annotations

import inspect
import logging
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn

from gte_pro.errors import ConfigError, ResumeError
from gte_pro.evaluation.metrics import evaluate_distributed
from gte_pro.evaluation.rows import ValidationRows
from gte_pro.models.encoder import Encoder
from gte_pro.training.gradcache import cached_loss
from gte_pro.training.guard import NonFiniteGuard
from gte_pro.training.losses import ContrastiveLoss, LossOutput, split_documents
from gte_pro.utils.progress import logs_this_step

CONFIG_KEY = "gte_pro_module_config"
log = logging.getLogger(__name__)


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


class ContrastiveModule(LightningModule):
    # the config groups a module is built from (``from_config``), saved with every checkpoint
    CONFIG_KEYS = ("model", "loss", "optimizer", "scheduler", "seed", "eval")

    def __init__(
        self,
        encoder: Encoder,
        loss: ContrastiveLoss,
        optimizer: Callable[..., torch.optim.Optimizer],
        lr: float,
        scheduler: Callable[..., Any] | None = None,
        warmup_ratio: float = 0.0,
        seed: int = 0,
        eval_quantization: Sequence[str] = (),
        eval_dims: Sequence[int] = (),
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.seed = seed
        self._train_metrics: dict[str, torch.Tensor] = {}  # the last step's, detached (read at checkpoints and end)
        self.loss = loss
        # skips optimizer steps with a NaN/inf loss or gradient norm (gte_pro.training.guard), up to
        # loss.max_skipped_steps
        self.guard = NonFiniteGuard(getattr(loss, "max_skipped_steps", 10))
        self._warned_accumulation = False
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.warmup_ratio = warmup_ratio
        self.eval_quantization = tuple(eval_quantization)  # validation also ranks quantized embeddings
        self.eval_dims = tuple(eval_dims)  # ... and the first d dimensions of the embeddings, for each d
        self.lr = lr  # a plain attribute, so that Lightning's learning-rate finder can set it
        # per validation dataloader: the signed ids and embeddings this rank computed
        self._val_rows: dict[int, ValidationRows] = {}  # per validation loader: this rank's ids and embeddings
        # the config parts it was built from (gte_pro.modes.build.build_module), saved with every checkpoint
        self.module_config: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: dict[str, Any], encoder: Encoder | None = None) -> ContrastiveModule:
        """The module that a run's resolved config parts (``CONFIG_KEYS``) describe; ``encoder``: one already built
        from ``config["model"]`` (None: build it). The parts are kept and saved with every checkpoint."""
        from hydra.utils import instantiate

        if encoder is None:
            encoder = instantiate({key: value for key, value in config["model"].items() if key != "lr"})
        scheduler = config.get("scheduler")
        module = cls(
            encoder=encoder,
            loss=instantiate(config["loss"]),
            optimizer=instantiate(config["optimizer"]),
            lr=config["model"]["lr"],
            scheduler=instantiate(scheduler["fn"]) if scheduler else None,
            warmup_ratio=scheduler["warmup_ratio"] if scheduler else 0.0,
            seed=config["seed"],
            eval_quantization=(config.get("eval") or {}).get("quantization") or (),
            eval_dims=(config.get("eval") or {}).get("truncate_dims") or (),
        )
        module.module_config = config
        return module

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, map_location: Any = "cpu",  # type: ignore[override]
                             **_: Any) -> ContrastiveModule:
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
    @property
    def mini_batch_size(self) -> int | None:
        """``loss.mini_batch_size``: set, the step uses the cached loss (GradCache). Its backward replays the chunks
        itself, so Lightning's automatic loop (precision, accumulation, clipping, schedulers, DDP sync) stays as is."""
        return getattr(self.loss, "mini_batch_size", None)

    def on_fit_start(self) -> None:
        if getattr(self, "_resumed_stopped", False):  # restored after the checkpoint: fit ends where it had stopped
            self.trainer.should_stop = True
            self._resumed_stopped = False
        if self.mini_batch_size and isinstance(getattr(self.trainer, "strategy", None), FSDPStrategy):
            # the replay re-runs the encoder inside backward and hands gradients to the parameter tensors of the
            # forward; FSDP gathers and frees sharded parameters around forward/backward itself
            raise ConfigError("loss.mini_batch_size (GradCache) is not supported with strategy=fsdp: use strategy=ddp, "
                             "or loss.mini_batch_size=null")
        accumulate = int(getattr(self.trainer, "accumulate_grad_batches", 1) or 1)
        if accumulate > 1 and not self._warned_accumulation:
            self._warned_accumulation = True  # once per module: lr_find and fit both start a fit
            self._explain_accumulation(accumulate)

    def _explain_accumulation(self, accumulate: int) -> None:
        if self.mini_batch_size:
            # a deliberate combination (optimizer batch = accumulate x data.batch_size, in the memory of
            # mini_batch_size texts): say what it does, without a warning
            if self.trainer.is_global_zero:  # gte-pro's own log: Lightning's info lines are left out (utils/quiet)
                log.info("trainer.accumulate_grad_batches=%d with loss.mini_batch_size=%d: each optimizer step "
                         "averages %d cached contrastive batches of data.batch_size; each query's negatives come "
                         "from its own batch only.", accumulate, self.mini_batch_size, accumulate)
            return
        rank_zero_warn(
            f"trainer.accumulate_grad_batches={accumulate} averages the gradients of {accumulate} batches, but "
            "the contrastive loss of each batch still only sees that batch's in-batch negatives: it does not "
            f"train like a {accumulate}x larger contrastive batch. For a large contrastive batch in the memory "
            "of a small one, raise data.batch_size and set loss.mini_batch_size (GradCache) instead, e.g. "
            "data.batch_size=1024 loss.mini_batch_size=32."
        )

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        # dropout (and any other draw) of a step depends on (seed, epoch, batch, rank) alone, not on what ran
        # before: a run resumed mid-epoch draws exactly what the uninterrupted run drew, with no RNG state to save
        step_seed = ((self.seed * 1_000_003 + self.current_epoch) * 1_000_003 + batch_idx) * 1_009 + self.global_rank
        step_seed %= 2**32
        random.seed(step_seed)
        np.random.seed(step_seed)
        torch.manual_seed(step_seed)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        out = self._contrastive_loss(batch)
        self.guard.observe(batch, out.loss)
        self._log_train_metrics(out, batch["query"]["input_ids"].shape[0])
        return out.loss

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any,
                       optimizer_closure: Callable[[], Any] | None = None) -> None:
        # runs the closure, then steps only when every loss and the gradient norm are finite (gte_pro.training.guard)
        self.guard.step(self, optimizer, optimizer_closure or (lambda: None))

    def _contrastive_loss(self, batch: dict[str, Any]) -> LossOutput:
        queries, docs, k = batch["query"], batch["doc"], batch["num_negatives"]
        # teacher scores (B, 1 + k) when the data has them: the distillation losses read them, the others ignore them
        extra = {"teacher_scores": batch["teacher_scores"]} if "teacher_scores" in batch else {}
        if self.mini_batch_size:
            # GradCache (gte_pro.training.gradcache): the same loss and gradients as below, in the activation memory of
            # mini_batch_size texts; its backward re-embeds the batch chunk by chunk
            return cached_loss(self.encoder, self.loss, queries, docs, k, self.mini_batch_size, **extra)
        query = self.encoder(**queries)
        positives, negatives = split_documents(self.encoder(**docs), query.shape[0], k)
        return self.loss(query, positives, negatives, **extra)

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

    # --- validation: retrieval over the held-out corpus and any named sets (BEIR folders) ------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_rows = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        embeddings = self.encoder(**batch["features"]).float()
        if dataloader_idx not in self._val_rows:
            self._val_rows[dataloader_idx] = ValidationRows(self._rows_expected(dataloader_idx),
                                                            embeddings.shape[-1], embeddings.device)
        self._val_rows[dataloader_idx].append(batch["ids"].to(embeddings.device), embeddings)

    def _rows_expected(self, dataloader_idx: int) -> int:
        """This rank's texts in that validation loader (its sampler's length: the distributed sampler's share)."""
        loaders = self.trainer.val_dataloaders
        loader = loaders[dataloader_idx] if isinstance(loaders, list | tuple) else loaders
        return len(loader.sampler) if hasattr(loader.sampler, "__len__") else 1

    def on_validation_epoch_end(self) -> None:
        rows_by_loader, self._val_rows = self._val_rows, {}
        by_set: dict[str, dict[str, float]] = {}
        empty = ValidationRows(0, self.encoder.dim, self.device)
        for index, (name, retrieval) in enumerate(self.trainer.datamodule.validation_sets()):
            ids, embeddings = rows_by_loader.get(index, empty).filled()
            # each rank holds the distributed sampler's share: the corpus stays sharded, only top-k lists travel
            metrics = evaluate_distributed(ids, embeddings, retrieval.relevant, len(retrieval.corpus),
                                           self.eval_quantization)
            prefix = f"val/{name}/" if name else "val/"
            # every rank computed the same numbers from the same merged rankings: no reduction needed
            for metric, value in metrics.items():
                self.log(prefix + metric, value, prog_bar=not name and metric == "ndcg@10", sync_dist=False,
                         add_dataloader_idx=False)
            self._log_truncated(prefix, ids, embeddings, retrieval)
            by_set[name] = metrics
        self._log_mean_over_sets(by_set)

    def _log_truncated(self, prefix: str, ids: torch.Tensor, embeddings: torch.Tensor, retrieval: Any) -> None:
        """``eval.truncate_dims``: the same retrieval on the first d dimensions (val/dim<d>/...), as
        ``SentenceTransformer(..., truncate_dim=d)`` embeds; the full dimension is the plain figure already."""
        for dim in self.eval_dims:
            if dim > embeddings.shape[-1]:
                raise ConfigError(f"eval.truncate_dims: {dim} is larger than the model's embedding dimension "
                                 f"{embeddings.shape[-1]}")
            if dim == embeddings.shape[-1]:
                continue
            metrics = evaluate_distributed(ids, embeddings[:, :dim], retrieval.relevant, len(retrieval.corpus))
            for metric, value in metrics.items():
                self.log(f"{prefix}dim{dim}/{metric}", value, sync_dist=False, add_dataloader_idx=False)

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
