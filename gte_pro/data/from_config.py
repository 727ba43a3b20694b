"""The data module a composed config names (``data/``): built here, on the data floor, so that both the run
(``gte_pro.modes.build``) and the memory plan (``gte_pro.preflight.batch_lengths``, which reads the batches before
the model loads) build it the same way."""

from __future__ import annotations

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig


def build_datamodule(cfg: DictConfig, tokenizer: Any, query_prefix: str = "", doc_prefix: str = "",
                     **collaborators: Any) -> Any:
    """The configured data module (``data/``), tokenizing with ``tokenizer`` and the model's prompts;
    ``collaborators``: what higher floors hand it (``gte_pro.data.collaborators``: ``negative_pool``, ``pair_join``,
    ``candidates``, ``eval_sets``), given here once and never set on it afterwards."""
    return instantiate(cfg.data, tokenizer=tokenizer, query_prefix=query_prefix, doc_prefix=doc_prefix,
                       seed=cfg.seed, **collaborators)
