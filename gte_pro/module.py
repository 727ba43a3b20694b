"""The Lightning module: contrastive training steps and retrieval validation."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch import LightningModule

from gte_pro.evaluation import evaluate_embeddings
from gte_pro.losses import ContrastiveLoss
from gte_pro.model import Encoder


def param_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    """Weight decay (the optimizer's own setting) on matrices only; biases and LayerNorm gains get none."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim < 2 else decay).append(param)
    groups: list[dict[str, Any]] = [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
    return [g for g in groups if g["params"]]


class ContrastiveModule(LightningModule):
    def __init__(
        self,
        encoder: Encoder,
        loss: ContrastiveLoss,
        optimizer: Callable[..., torch.optim.Optimizer],
        lr: float,
        scheduler: Callable[..., Any] | None = None,
        warmup_ratio: float = 0.0,
    ) -> None:
        super().__init__()
        self.encoder = encoder
        self.loss = loss
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        self.warmup_ratio = warmup_ratio
        self.lr = lr  # a plain attribute, so that Lightning's learning-rate finder can set it
        self._val_ids: list[torch.Tensor] = []
        self._val_embeddings: list[torch.Tensor] = []

    # --- training ---------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        query = self.encoder(**batch["query"])
        docs = self.encoder(**batch["doc"])
        batch_size, k = query.shape[0], batch["num_negatives"]
        negatives = docs[batch_size:].reshape(batch_size, k, -1) if k else None
        out = self.loss(query, docs[:batch_size], negatives)
        scores = out.scores.float()
        positive_scores = scores.gather(1, out.labels[:, None])
        negative_mean = (scores.sum() - positive_scores.sum()) / max(scores.numel() - batch_size, 1)
        self.log_dict(
            {
                "train/loss": out.loss,
                "train/acc": (scores.argmax(1) == out.labels).float().mean(),
                "train/sim_pos": positive_scores.mean(),
                "train/sim_neg": negative_mean,
            },
            prog_bar=True,
            batch_size=batch_size,
        )
        return out.loss

    # --- validation: retrieval over the held-out corpus ------------------------------------------------------
    def on_validation_epoch_start(self) -> None:
        self._val_ids, self._val_embeddings = [], []

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._val_ids.append(batch["ids"])
        self._val_embeddings.append(self.encoder(**batch["features"]).float())

    def on_validation_epoch_end(self) -> None:
        retrieval = self.trainer.datamodule.retrieval
        ids = torch.cat(self._val_ids)
        embeddings = torch.cat(self._val_embeddings)
        self._val_ids, self._val_embeddings = [], []
        if self.trainer.world_size > 1:
            # the distributed sampler hands each rank an equal share (padded with repeats): gather all, dedupe
            ids = self.all_gather(ids).reshape(-1)
            embeddings = self.all_gather(embeddings).reshape(-1, embeddings.shape[-1])
        ids, embeddings = ids.cpu(), embeddings.cpu()
        query_emb = torch.zeros(len(retrieval.queries), embeddings.shape[-1])
        corpus_emb = torch.zeros(len(retrieval.corpus), embeddings.shape[-1])
        is_query = ids >= 0
        query_emb[ids[is_query]] = embeddings[is_query]
        corpus_emb[-ids[~is_query] - 1] = embeddings[~is_query]
        seen = torch.unique(ids)
        if seen.numel() != len(retrieval.queries) + len(retrieval.corpus):
            raise RuntimeError(f"validation embedded {seen.numel()} distinct texts, expected "
                               f"{len(retrieval.queries) + len(retrieval.corpus)}")
        metrics = evaluate_embeddings(query_emb, corpus_emb, retrieval.relevant)
        # every rank computed the same numbers from the same gathered embeddings: no reduction needed
        for name, value in metrics.items():
            self.log(f"val/{name}", value, prog_bar=name == "ndcg@10", sync_dist=False)

    # --- optimisation ---------------------------------------------------------------------------------------
    def configure_optimizers(self) -> Any:
        optimizer = self.optimizer_factory(param_groups(self.encoder), lr=self.lr)
        if self.scheduler_factory is None:
            return optimizer
        total_steps = int(self.trainer.estimated_stepping_batches)
        kwargs: dict[str, Any] = {"num_warmup_steps": int(self.warmup_ratio * total_steps)}
        if "num_training_steps" in inspect.signature(self.scheduler_factory).parameters:
            kwargs["num_training_steps"] = total_steps
        scheduler = self.scheduler_factory(optimizer, **kwargs)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}
