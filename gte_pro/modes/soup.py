"""A sweep's model soup: ``python train.py -m model.lr=1e-5,2e-5 sweep.soup=greedy`` merges the models of the
sweep's finished runs after its last job (``mode=merge`` with ``merge.method=<sweep.soup>``, into
``<sweep dir>/soup``); the sweep's summary then carries the soup's row next to its runs' (``gte_pro.launch.sweep``)
and ``<sweep dir>/soup.md`` the soup table (each member's and the soup's validation).

conf/hydra/default.yaml lists this callback after the summary's: Hydra calls the end-of-multirun callbacks in
reverse order, so the soup is made first and the summary written with it.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf, open_dict

from gte_pro.launch.sweep import SOUP_DIR

log = logging.getLogger(__name__)

try:
    from hydra.experimental.callback import Callback as _HydraCallback
except ImportError:  # pragma: no cover - hydra < 1.1
    _HydraCallback = object  # type: ignore[misc,assignment]


def finished_models(sweep_dir: Path) -> list[Path]:
    """``<job>/model`` of every job of the sweep that finished (its metrics.json and model folder are there), in job
    order."""
    jobs = sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    return [job / "model" for job in jobs if (job / "metrics.json").is_file() and (job / "model" / "config.json")
            .is_file()]


def soup_config(config: DictConfig, models: list[Path], method: str, output_dir: Path) -> DictConfig:
    """The sweep's config as mode=merge of ``models`` into ``output_dir``."""
    cfg = OmegaConf.create(OmegaConf.to_container(config, resolve=False))
    with open_dict(cfg):
        cfg.pop("hydra", None)
        cfg.mode = "merge"
        cfg.merge.models = [str(model) for model in models]
        cfg.merge.method = method
        cfg.paths.output_dir = str(output_dir)
    return cfg


def make_sweep_soup(config: DictConfig) -> Path | None:
    """``sweep.soup``: merge the sweep's finished runs into ``<sweep dir>/soup``; its folder, or None (no soup asked
    for, or fewer than two finished runs)."""
    method = OmegaConf.select(config, "sweep.soup", default=None)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    if not method or not sweep_dir.is_dir():
        return None
    models = finished_models(sweep_dir)
    if len(models) < 2:
        log.warning("sweep.soup=%s: %d finished run(s) in %s; a soup needs two: none made", method, len(models),
                    sweep_dir)
        return None
    from gte_pro.modes.merge import merge  # lightning: only when a soup is made

    output_dir = sweep_dir / SOUP_DIR
    log.info("sweep.soup=%s: merging %d runs into %s", method, len(models), output_dir)
    merge(soup_config(config, models, str(method), output_dir))
    return output_dir


class SweepSoup(_HydraCallback):
    """Hydra callback: ``sweep.soup`` after a multirun (an error is logged; the sweep's runs stay as they are)."""

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            folder = make_sweep_soup(config)
        except Exception as error:  # noqa: BLE001 - the runs are done and kept; the soup is an extra
            log.error("sweep.soup: no soup made: %s: %s", type(error).__name__, error)
            return
        if folder is not None:
            summary = json.loads((folder / "metrics.json").read_text())
            log.info("sweep soup: %s %.4f (%s)", summary["metric"], summary["val"][summary["metric"]], folder)
