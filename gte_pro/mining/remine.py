"""Re-mining during training (``data.remine``): fresh hard negatives from the current weights, every N epochs.

At the start of a due epoch (before its first batch is fetched) every rank embeds its share of the training queries
and of the training corpus (every row's distinct positives) with the current weights, in inference mode and the
trainer's precision; the ranks mine the same negatives with the ``mine.*`` options (exact, sharded top-k:
``gte_pro.mining.core``); rank 0 writes the pool (``gte_pro.mining.pool``) and from then on the training dataset
draws each row's hard negatives from it. A resumed run uses the pool that was active at its checkpoint: pools of
later epochs (left by the killed run) are removed, and a missing due pool is mined again from the same weights.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer

from gte_pro.errors import ConfigError, DataError
from gte_pro.mining.embed import mine_texts
from gte_pro.mining.options import MiningOptions
from gte_pro.mining.pool import NegativePool, write_pool

log = logging.getLogger(__name__)


def training_corpus(table: Any) -> tuple[
        list[str], list[str], np.ndarray, list[list[int]]]:
    """(queries, corpus, corpus id -> (row, positive index), each row's positives as corpus ids) of a token cache's
    table. The corpus is every row's positives, identical texts once: a row's positives (and their duplicates in
    other rows) are never its negatives."""
    texts = table.select_columns(["query_text", "positive_texts"])
    queries, corpus, refs, positives = [], [], [], []
    ids: dict[str, int] = {}
    for row, (query, docs) in enumerate(zip(texts["query_text"], texts["positive_texts"], strict=True)):
        queries.append(query)
        own = []
        for j, doc in enumerate(docs):
            if doc not in ids:
                ids[doc] = len(corpus)
                corpus.append(doc)
                refs.append((row, j))
            own.append(ids[doc])
        positives.append(own)
    return queries, corpus, np.asarray(refs, dtype=np.int32).reshape(-1, 2), positives


class RemineNegatives(Callback):
    """Mines a fresh negative pool at the start of every ``every_n_epochs``-th epoch (and of epoch 0 with
    ``at_start``) into ``folder``; the data module, built with ``negative_pool=callback.pool``, draws from it."""

    def __init__(self, folder: str | Path, options: MiningOptions, every_n_epochs: int = 1, at_start: bool = False,
                 batch_size: int = 128, max_length: int = 256) -> None:
        if every_n_epochs < 0:
            raise ConfigError(f"data.remine.every_n_epochs must be >= 0 (0: off), got {every_n_epochs}")
        self.pool = NegativePool(folder, options.num_negatives)
        self.options = options
        self.every_n_epochs = every_n_epochs
        self.at_start = at_start
        self.batch_size = batch_size
        self.max_length = max_length
        self.costs: list[dict[str, float]] = []  # one entry per re-mine: its seconds, and its epoch's
        self._epoch_start: float | None = None

    def due(self, epoch: int) -> bool:
        if epoch == 0:
            return self.at_start
        return bool(self.every_n_epochs) and epoch % self.every_n_epochs == 0

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        if not getattr(datamodule, "num_negatives", 0):
            raise ConfigError("data.remine needs hard negatives to draw: set data.num_negatives > 0 or null "
                             f"(now {getattr(datamodule, 'num_negatives', None)})")
        if getattr(datamodule, "negative_pool", None) is not self.pool:
            raise RuntimeError("data.remine: build the data module with negative_pool=<this callback>.pool "
                               "(gte_pro.modes.build.build_data_for)")

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        epoch = trainer.datamodule.next_train_epoch()
        if trainer.is_global_zero:
            removed = self.pool.discard_after(epoch)
            if removed:
                log.info("remine: removed the pools of epochs %s, mined after the checkpoint", removed)
        trainer.strategy.barrier("remine-discard")
        self.pool.refresh()
        self.pool.check(len(trainer.datamodule.token_cache), pl_module.encoder.dim)
        self._ensure(trainer, pl_module, epoch)  # a resumed epoch's loader is opened before its epoch-start hook

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._epoch_start = time.perf_counter()
        if self._ensure(trainer, pl_module, trainer.current_epoch):
            pl_module.log("remine/seconds", self.costs[-1]["seconds"], rank_zero_only=True)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._epoch_start is None or not self.costs or self.costs[-1].get("epoch") != trainer.current_epoch:
            return
        cost = self.costs[-1]
        cost["epoch_seconds"] = time.perf_counter() - self._epoch_start - cost["seconds"]
        log.info("remine: epoch %d trained in %.1f s; its re-mine took %.1f s (%.0f%% of the training time)",
                 trainer.current_epoch, cost["epoch_seconds"], cost["seconds"],
                 100 * cost["seconds"] / max(cost["epoch_seconds"], 1e-9))

    def _ensure(self, trainer: Trainer, pl_module: LightningModule, epoch: int) -> bool:
        """Mine the pool of ``epoch`` if it is due and not there yet; whether it mined."""
        if not self.due(epoch) or self.pool.has(epoch):
            return False
        start = time.perf_counter()
        summary = self._mine(trainer, pl_module, epoch)
        seconds = time.perf_counter() - start
        self.costs.append({"epoch": epoch, "seconds": seconds})
        log.info("remine: epoch %d pool mined in %.1f s (%d rows, %.2f negatives a row, %d candidates dropped as "
                 "likely false negatives)", epoch, seconds, summary["rows"], summary["negatives_per_row"],
                 summary["dropped_false_negatives"])
        return True

    def _mine(self, trainer: Trainer, pl_module: LightningModule, epoch: int) -> dict[str, Any]:
        datamodule = trainer.datamodule
        queries, corpus, refs, positives = training_corpus(datamodule.token_cache.table)
        if not corpus:
            raise DataError("data.remine: the training corpus is empty")
        encoder = pl_module.encoder
        # the encoder's prompts are added by mine_texts; inference mode, the trainer's precision, sharded over ranks
        mined = mine_texts(encoder, queries, corpus, positives, self.options, self.batch_size, self.max_length,
                           autocast=trainer.strategy.precision_plugin.forward_context)
        indices = mined.indices.cpu().numpy()
        pool = np.where(indices[..., None] >= 0, refs[np.clip(indices, 0, None)], -1)
        found = (indices >= 0).sum(axis=1)
        summary = {"rows": len(queries), "corpus": len(corpus), "negatives_per_row": float(found.mean()),
                   "short_rows": int(mined.short_rows), "dropped_false_negatives": int(mined.dropped_false_negatives),
                   "dim": int(encoder.dim), "global_step": int(trainer.global_step)}
        if trainer.is_global_zero:
            write_pool(self.pool.folder, epoch, pool, summary)
        trainer.strategy.barrier("remine-written")
        self.pool.refresh()
        return summary


def remine_callback(cfg: Any, output_dir: Path) -> RemineNegatives | None:
    """The callback of ``data.remine`` (None when off), mining with the ``mine.*`` options."""
    remine = cfg.data.get("remine") or {}
    every, at_start = int(remine.get("every_n_epochs", 0) or 0), bool(remine.get("at_start", False))
    if not every and not at_start:
        return None
    from gte_pro.mining.options import mining_options

    mine = cfg.get("mine") or {}
    if mine.get("rescore_with"):  # check_config says so first; this guards a config built without it
        raise ConfigError(f"mine.rescore_with={mine.get('rescore_with')!r}: not supported with data.remine (re-mining "
                          "during training mines with the embedder alone); set mine.rescore_with=null")
    return RemineNegatives(output_dir / "negatives", mining_options(mine, cfg.seed), every, at_start,
                           batch_size=int(mine.get("batch_size") or cfg.data.eval_batch_size),
                           max_length=int(mine.get("max_length") or cfg.data.max_length))
