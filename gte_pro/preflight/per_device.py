"""The per-device work of a composed config (texts per forward, rows, negatives, GradCache's mini-batch, FSDP's
shards, the loss's embeddings and score matrix): the :class:`gte_pro.preflight.memory_estimate.Setup` that the memory
estimate reads."""

from __future__ import annotations

from typing import Any

from gte_pro.preflight.memory_estimate import Setup


def negatives_of(cfg: Any) -> int:
    """Hard negatives per row as the config alone tells: data.num_negatives, or for null (as many as the rows
    carry, unknown before they are read) at least what re-mining finds (mine.num_negatives), else 0."""
    setting = cfg.data.get("num_negatives")
    if setting is not None:
        return int(setting)
    remine = cfg.data.get("remine") or {}
    return int(cfg.mine.num_negatives) if (remine.get("every_n_epochs") or remine.get("at_start")) else 0


def mini_batch_of(cfg: Any) -> int | None:
    """``loss.mini_batch_size`` as a number (None: off, or ``auto`` not yet resolved:
    gte_pro.preflight.auto_mini_batch)."""
    value = cfg.get("loss", {}).get("mini_batch_size")
    return int(value) if value and value != "auto" else None


def world_of(cfg: Any) -> int:
    """Processes of the run (1 where ``devices`` is not a number: ``auto``)."""
    try:
        return max(int(cfg.get("devices", 1)) * int(cfg.get("nodes", 1)), 1)
    except (TypeError, ValueError):
        return 1


def score_cells_of(cfg: Any, rows: int, negatives: int) -> int:
    """The loss's score matrix: each of ``rows`` local queries against the candidates of the batch (every rank's,
    with ``loss.gather_across_devices``): InfoNCE's documents; GTE's documents and queries, from queries and from
    positives (gte_pro.training.losses)."""
    loss = cfg.get("loss", {})
    global_rows = rows * (world_of(cfg) if loss.get("gather_across_devices", True) else 1)
    documents = global_rows * (1 + negatives)
    if str(loss.get("_target_", "")).endswith("GTELoss"):
        return rows * 2 * (documents + global_rows)
    return rows * documents


def setup_of(cfg: Any, cuda: bool, num_negatives: int | None = None) -> Setup:
    """The per-device work of the composed config ``cfg``; ``num_negatives``: per row, where the data told it."""
    task = str(cfg.get("task", "embed"))
    negatives = negatives_of(cfg) if num_negatives is None else num_negatives
    per_row = 1 + negatives + (0 if task == "rerank" else 1)
    rows = int(cfg.data.batch_size)
    batch_texts = texts = rows * per_row
    mini_batch = mini_batch_of(cfg)
    if mini_batch:
        texts = min(texts, mini_batch)
    strategy = str(cfg.get("strategy", {}).get("_target_", "") or "")
    shards = world_of(cfg) if strategy.endswith("FSDPStrategy") else 1
    scores = score_cells_of(cfg, rows, negatives) if task == "embed" else 0
    return Setup(precision=str(cfg.trainer.precision), texts=texts, tokens_per_text=int(cfg.model.max_length),
                 rows=rows, mini_batch=mini_batch, batch_texts=batch_texts if task == "embed" else 0,
                 score_cells=scores,
                 checkpointing=bool(cfg.model.get("gradient_checkpointing", False)),
                 lora=bool(cfg.model.get("lora")), shards=shards,
                 eager_attention=cfg.model.get("attn_implementation") == "eager", cuda=cuda)
