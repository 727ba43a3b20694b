"""The embedder's Lightning module: contrastive training steps and retrieval validation."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.utilities import rank_zero_warn

from gte_pro.errors import ConfigError
from gte_pro.evaluation.metrics import evaluate_distributed
from gte_pro.evaluation.rows import ValidationRows
from gte_pro.training.base_module import TrainingModule
from gte_pro.training.gradcache import cached_loss
from gte_pro.training.guide import Guide
from gte_pro.training.losses import LossOutput, split_documents
from gte_pro.training.telemetry import step_telemetry, telemetry_due

log = logging.getLogger(__name__)


class ContrastiveModule(TrainingModule):
    """The embedder's module: a contrastive loss over in-batch (and hard) negatives, exactly under GradCache and
    DDP, and retrieval validation over the held-out corpus and any named sets."""

    def __init__(self, *args: Any, eval_quantization: Sequence[str] = (), eval_dims: Sequence[int] = (),
                 telemetry_every_n_steps: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._warned_accumulation = False
        self.eval_quantization = tuple(eval_quantization)  # validation also ranks quantized embeddings
        self.eval_dims = tuple(eval_dims)  # ... and the first d dimensions of the embeddings, for each d
        self.telemetry_every_n_steps = telemetry_every_n_steps or 0  # telemetry/* every N steps (0: off)
        self._telemetry_step = -1  # the step last logged
        # loss.guide (gte_pro.training.guide): loaded at fit start; a plain attribute, outside the module tree
        self.guide: Guide | None = None
        # per validation dataloader: the signed ids and embeddings this rank computed
        self._val_rows: dict[int, ValidationRows] = {}

    @classmethod
    def options_from_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        evaluation = config.get("eval") or {}
        return {"eval_quantization": evaluation.get("quantization") or (),
                "eval_dims": evaluation.get("truncate_dims") or (),
                # a checkpoint saved before the key existed gets the schema's default
                "telemetry_every_n_steps": evaluation.get("telemetry_every_n_steps", 50)}

    # --- training ---------------------------------------------------------------------------------------------
    @property
    def mini_batch_size(self) -> int | None:
        """``loss.mini_batch_size``: set, the step uses the cached loss (GradCache). Its backward replays the chunks
        itself, so Lightning's automatic loop (precision, accumulation, clipping, schedulers, DDP sync) stays as is."""
        return getattr(self.loss, "mini_batch_size", None)

    def on_fit_start(self) -> None:
        super().on_fit_start()
        name = getattr(self.loss, "guide", None)
        if name and self.guide is None:  # once per module: lr_find and fit both start a fit
            model = self.module_config["model"] if self.module_config else {}
            self.guide = Guide.load(name, self.encoder, trust_remote_code=model.get("trust_remote_code") is True)
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

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        out = self._contrastive_loss(batch)
        self.guard.observe(batch, out.loss)
        self._log_train_metrics(out, batch["query"]["input_ids"].shape[0])
        self._log_telemetry(out, batch)
        return out.loss

    def _log_telemetry(self, out: LossOutput, batch: dict[str, Any]) -> None:
        """``eval.telemetry_every_n_steps``: telemetry/* (gte_pro.training.telemetry) from the step's own scores and
        embeddings, written to the loggers at the step the train metrics carry.

        Straight to the loggers, not through ``self.log``: Lightning writes every step value it holds at each step it
        writes, so figures logged every N steps would be written again, stale, at the written steps in between.
        Loggers write on rank 0 only; no collective is added that ranks could disagree about."""
        if not self.telemetry_every_n_steps or not self.loggers:
            return
        step = self.trainer.fit_loop.epoch_loop._batches_that_stepped  # the step column of this step's train metrics
        if not telemetry_due(step + 1, self.telemetry_every_n_steps) or step == self._telemetry_step:
            return
        self._telemetry_step = step  # accumulated micro-batches share their step: the first one's figures
        figures = step_telemetry(out.scores, out.labels, out.query, out.positive, batch["num_negatives"],
                                 batch.get("teacher_scores"), out.masked_share, out.guide_masked_share)
        for logger in self.loggers:
            logger.log_metrics(figures, step=step)

    def _contrastive_loss(self, batch: dict[str, Any]) -> LossOutput:
        queries, docs, k = batch["query"], batch["doc"], batch["num_negatives"]
        # teacher scores (B, 1 + k) when the data has them: the distillation losses read them, the others ignore them
        extra = {"teacher_scores": batch["teacher_scores"]} if "teacher_scores" in batch else {}
        if self.guide is not None:  # the guide's embeddings of the whole batch, once, in the student's chunks
            extra["guide"] = self.guide.batch(batch, self.mini_batch_size)
        if self.mini_batch_size:
            # GradCache (gte_pro.training.gradcache): the same loss and gradients as below, in the activation memory of
            # mini_batch_size texts; its backward re-embeds the batch chunk by chunk
            return cached_loss(self.encoder, self.loss, queries, docs, k, self.mini_batch_size, **extra)
        query = self.encoder(**queries)
        positives, negatives = split_documents(self.encoder(**docs), query.shape[0], k)
        return self.loss(query, positives, negatives, **extra)

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
