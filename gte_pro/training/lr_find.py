"""``lr_find=true``: Lightning's learning-rate range test before training; the run trains with its suggestion."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from lightning.pytorch import Trainer
from omegaconf import DictConfig

from gte_pro.errors import ConfigError
from gte_pro.training.base_module import TrainingModule

log = logging.getLogger(__name__)


def find_lr(cfg: DictConfig, trainer: Trainer, module: TrainingModule, datamodule: Any, output_dir: Path,
            ckpt_path: str | None) -> float | None:
    """``lr_find=true``: the suggested learning rate, which the module then trains with (not on a resumed run)."""
    if cfg.lr_find and ckpt_path:
        log.info("lr_find: skipped, the run resumes from %s with its optimizer's learning rate", ckpt_path)
    elif cfg.lr_find:
        return run_lr_find(trainer, module, datamodule, output_dir, cfg.lr_find_steps)
    return None


def run_lr_find(trainer: Trainer, module: TrainingModule, datamodule: Any, output_dir: Path,
                num_training: int = 100) -> float:
    """Lightning's learning-rate range test; saves the plot and sets the module's lr to the suggestion.

    The whole sweep is recorded (no early stop on divergence): the suggestion needs the full curve.
    """
    from lightning.pytorch.tuner import Tuner

    if trainer.world_size > 1:
        raise ConfigError("lr_find=true runs on one device: drop strategy=ddp/devices>1 for the search, "
                         "then train with the suggested model.lr")
    finder = Tuner(trainer).lr_find(module, datamodule=datamodule, update_attr=True, attr_name="lr",
                                    num_training=num_training, early_stop_threshold=None)
    if finder is None or finder.suggestion() is None:
        raise RuntimeError("the learning-rate finder produced no suggestion (loss curve too short or flat)")
    figure = finder.plot(suggest=True)
    figure.savefig(output_dir / "lr_find.png")
    log.info("lr_find: suggested lr %.3g (plot: %s)", finder.suggestion(), output_dir / "lr_find.png")
    return float(finder.suggestion())
