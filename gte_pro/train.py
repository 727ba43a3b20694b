"""``train(cfg)``: the one entry point of every run; ``cfg.mode`` picks the flow.

``train.py`` at the repository root is a thin ``@hydra.main`` wrapper around this function; the tests call it
with configs made by Hydra's compose API. Each call is one job with its own distributed environment
(``job_scope``), so that a sweep can run many jobs in one process.
"""

from __future__ import annotations

from omegaconf import DictConfig

from gte_pro.config.checks import check_config
from gte_pro.launch.environment import job_scope
from gte_pro.modes.evaluate import evaluate
from gte_pro.modes.fit import fit
from gte_pro.modes.mine import mine
from gte_pro.modes.score import score
from gte_pro.utils.quiet import quiet_third_party

MODES = {"train": fit, "eval": evaluate, "mine": mine, "score": score}


def train(cfg: DictConfig) -> float | None:
    """Run ``cfg.mode`` (train: fit + export; eval: evaluate only; mine: hard negatives; score: teacher scores);
    return ``cfg.optimized_metric`` (None for mine and score)."""
    quiet_third_party()  # the log keeps what a user can act on (gte_pro.utils.quiet)
    check_config(cfg)  # a wrong type, range or mode fails here, naming the key, not as a TypeError deep inside
    with job_scope(cfg.devices, cfg.get("nodes", 1)):
        return MODES[cfg.get("mode", "train")](cfg)
