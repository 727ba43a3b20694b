"""The reranker's Lightning module (``task=rerank``): a cross-encoder trained on groups of (query, document) pairs
(the positive and the row's hard negatives) and validated by reranking each held-out query's candidates
(``gte_pro.training.rerank_validation``)."""

from __future__ import annotations

import logging
from typing import Any

import torch

from gte_pro.errors import ConfigError
from gte_pro.evaluation.metrics import retrieval_metrics
from gte_pro.evaluation.rows import ValidationRows
from gte_pro.models.encoder import Encoder
from gte_pro.retrieval import RetrievalSet
from gte_pro.training.base_module import TrainingModule
from gte_pro.training.rerank_validation import (
    ROWS,
    ValidationCandidates,
    gather_pair_scores,
    reranked,
    retriever_candidates,
    retriever_ranking,
    rows_candidates,
)

log = logging.getLogger(__name__)


class RerankModule(TrainingModule):
    """``encoder`` is a ``gte_pro.models.cross_encoder.CrossEncoder``; ``loss`` a reranker's loss
    (``gte_pro.training.losses.listwise``, ``.pointwise_bce``). ``retriever``: where validation's candidates come from
    (an embedder's path or hub name, or ``rows``), ``rerank_depth`` of them per query."""

    def __init__(self, *args: Any, retriever_batch_size: int, retriever: str | None = None, rerank_depth: int = 100,
                 retriever_max_length: int | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.retriever = retriever
        self.retriever_max_length = retriever_max_length  # the evaluation's truncation (eval.max_length)
        self.rerank_depth = int(rerank_depth)
        self.retriever_batch_size = int(retriever_batch_size)
        self._val_rows: dict[int, ValidationRows] = {}
        # per validation set, each query's candidates: the data module serves them (modes.build hands it this)
        self.validation_candidates = ValidationCandidates()
        self.retriever_metrics: list[dict[str, float]] = []  # per validation set: the candidates' own ranking

    @classmethod
    def options_from_config(cls, config: dict[str, Any]) -> dict[str, Any]:
        evaluation = config.get("eval") or {}
        return {"retriever": evaluation.get("retriever"), "rerank_depth": evaluation.get("rerank_depth", 100),
                # eval.retriever_batch_size: ${data.eval_batch_size} (the schema fills it; every rerank run carried it)
                "retriever_batch_size": evaluation["retriever_batch_size"],
                "retriever_max_length": evaluation.get("max_length")}

    # --- training ---------------------------------------------------------------------------------------------
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        logits = self.encoder(**batch["pairs"]).view(-1, batch["group_size"])
        out = self.loss(logits)
        self.guard.observe(batch, out.loss)
        self._log_train_metrics(out, logits.shape[0])
        return out.loss

    # --- validation -------------------------------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        """Once the data module is set up (and the process group exists): the candidates of every validation set,
        which the data module (built with ``validation_candidates``) serves as pairs."""
        datamodule = self.trainer.datamodule
        if datamodule.candidate_source is not self.validation_candidates:
            raise RuntimeError("task=rerank: build the data module with candidates=module.validation_candidates "
                               "(gte_pro.modes.build.build_data_for)")
        if self.validation_candidates.found is None:
            found = self._find_candidates(datamodule.validation_sets())
            self.retriever_metrics = [retrieval_metrics(retriever_ranking(candidates), retrieval.relevant)
                                      for candidates, (_, retrieval) in zip(found, datamodule.validation_sets(),
                                                                            strict=True)]
            self.validation_candidates.found = found

    def _find_candidates(self, sets: list[tuple[str, RetrievalSet]]) -> list[list[list[int]]]:
        if self.retriever == ROWS:
            return [rows_candidates(retrieval, name) for name, retrieval in sets]
        if not self.retriever:
            raise ConfigError("task=rerank validates by reranking an embedder's top documents: set "
                             "eval.retriever=<embedder path or hub name> (or eval.retriever=rows)")
        device = self.trainer.strategy.root_device
        options = {"max_length": self.retriever_max_length} if self.retriever_max_length else {}
        # one padded pass: each rank's candidates must not depend on which rows share a batch there
        retriever = Encoder.load(self.retriever, length_chunks=1, **options).to(device)
        found = []
        for name, retrieval in sets:
            found.append(retriever_candidates(retriever, retrieval, self.rerank_depth, self.retriever_batch_size))
            log.info("reranker validation %s: the top %d of %d documents by %s for each of %d queries",
                     name or "(held-out)", min(self.rerank_depth, len(retrieval.corpus)), len(retrieval.corpus),
                     self.retriever, len(retrieval.queries))
        del retriever
        return found

    def on_validation_epoch_start(self) -> None:
        self._val_rows = {}

    def validation_step(self, batch: dict[str, Any], batch_idx: int, dataloader_idx: int = 0) -> None:
        scores = self.encoder(**batch["features"]).float()[:, None]
        if dataloader_idx not in self._val_rows:
            loaders = self.trainer.val_dataloaders
            loader = loaders[dataloader_idx] if isinstance(loaders, list | tuple) else loaders
            self._val_rows[dataloader_idx] = ValidationRows(len(loader.sampler), 1, scores.device)
        self._val_rows[dataloader_idx].append(batch["ids"].to(scores.device), scores)

    def on_validation_epoch_end(self) -> None:
        rows_by_loader, self._val_rows = self._val_rows, {}
        by_set: dict[str, dict[str, float]] = {}
        for index, (name, retrieval) in enumerate(self.trainer.datamodule.validation_sets()):
            candidates = self.validation_candidates.candidates(index)
            ids, scores = rows_by_loader.get(index, ValidationRows(0, 1, self.device)).filled()
            total = sum(len(c) for c in candidates)
            metrics = retrieval_metrics(reranked(candidates, gather_pair_scores(ids, scores[:, 0], total)),
                                        retrieval.relevant)
            prefix = f"val/{name}/" if name else "val/"
            for metric, value in metrics.items():
                self.log(prefix + metric, value, prog_bar=not name and metric == "ndcg@10", sync_dist=False,
                         add_dataloader_idx=False)
            for metric, value in self.retriever_metrics[index].items():
                self.log(f"{prefix}retriever/{metric}", value, sync_dist=False, add_dataloader_idx=False)
            by_set[name] = metrics
        self._log_mean_over_sets(by_set)
