"""Before the weights load (config -> resolve -> pre-flight -> build -> mode): the run's data module where it can
come first (``task=embed``), and the pre-flight's decisions on it (``gte_pro.preflight.run``), the mini-batch
settled in the config the loss is built from."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gte_pro.modes.build import build_data_before_model
from gte_pro.preflight.auto_mini_batch import settle
from gte_pro.preflight.run import Decisions, preflight


def prepare(cfg: DictConfig, run_folder: Path | None = None, resumed: bool = False,
            **collaborators: Any) -> tuple[Any | None, Decisions]:
    """(the run's data module, or None where it needs the built module: ``task=rerank``; the pre-flight's
    decisions). ``collaborators``: the data module's (``eval_sets``, ``negative_pool``); ``run_folder`` keeps the
    ``loss.mini_batch_size=auto`` choice, which a ``resumed`` run reuses. Raises
    ``gte_pro.preflight.memory_budget.MemoryBudgetError`` for a run that does not fit."""
    datamodule = build_data_before_model(cfg, **collaborators)
    decisions = preflight(cfg, datamodule, run_folder, resumed)
    settle(cfg, decisions.mini_batch)
    return datamodule, decisions
