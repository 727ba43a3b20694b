"""The per-device work of a composed config (texts per forward, rows, negatives, GradCache's mini-batch, FSDP's
shards, the loss's embeddings and score matrix): the :class:`gte_pro.preflight.memory_estimate.Setup` that the memory
estimate reads."""

from __future__ import annotations

from typing import Any

from omegaconf import OmegaConf

from gte_pro.config.resolve import run_shape
from gte_pro.preflight.memory_estimate import Setup


def negatives_of(cfg: Any) -> int:
    """Hard negatives per row as the config alone tells: data.num_negatives, or for null (as many as the rows
    carry, unknown before they are read) at least what re-mining finds (mine.num_negatives), else 0."""
    setting = cfg.data.num_negatives
    if setting is not None:
        return int(setting)
    return int(cfg.mine.num_negatives) if remines(cfg) else 0


def remines(cfg: Any) -> bool:
    """Whether the run re-mines its negatives during training (``data.remine``: the pool's rows, not the cache's)."""
    remine = OmegaConf.select(cfg, "data.remine", default=None) or {}
    return bool(remine.get("every_n_epochs") or remine.get("at_start"))


def mini_batch_of(cfg: Any) -> int | None:
    """``loss.mini_batch_size`` as a number (None: off, or ``auto`` not yet resolved:
    gte_pro.preflight.auto_mini_batch)."""
    value = cfg.loss.get("mini_batch_size")  # the rerank losses have none
    return int(value) if value and value != "auto" else None


def score_cells_of(cfg: Any, rows: int, negatives: int) -> int:
    """The loss's score matrix: each of ``rows`` local queries against the candidates of the batch (every rank's,
    with ``loss.gather_across_devices``): InfoNCE's documents; GTE's documents and queries, from queries and from
    positives (gte_pro.training.losses)."""
    loss = cfg.loss
    # a loss of the user's own that does not say whether it gathers: the larger matrix
    gathers = loss.get("gather_across_devices") is not False
    global_rows = rows * (run_shape(cfg).world_size if gathers else 1)
    documents = global_rows * (1 + negatives)
    if str(loss._target_).endswith("GTELoss"):
        return rows * 2 * (documents + global_rows)
    return rows * documents


def setup_of(cfg: Any, cuda: bool, num_negatives: int | None = None) -> Setup:
    """The per-device work of the composed config ``cfg``; ``num_negatives``: per row, where the data told it."""
    task = str(cfg.task)
    negatives = negatives_of(cfg) if num_negatives is None else num_negatives
    per_row = 1 + negatives + (0 if task == "rerank" else 1)
    rows = int(cfg.data.batch_size)
    batch_texts = texts = rows * per_row
    mini_batch = mini_batch_of(cfg)
    if mini_batch:
        texts = min(texts, mini_batch)
    run = run_shape(cfg)
    shards = run.world_size if run.fsdp else 1
    scores = score_cells_of(cfg, rows, negatives) if task == "embed" else 0
    return Setup(precision=str(cfg.trainer.precision), texts=texts, tokens_per_text=int(cfg.model.max_length),
                 rows=rows, mini_batch=mini_batch, batch_texts=batch_texts if task == "embed" else 0,
                 score_cells=scores,
                 checkpointing=bool(cfg.model.get("gradient_checkpointing")),
                 lora=bool(cfg.model.get("lora")), shards=shards,  # a cross-encoder has no LoRA key
                 eager_attention=cfg.model.get("attn_implementation") == "eager", cuda=cuda)
