"""Step metrics are computed into ``self.log`` only on the steps Lightning writes to the loggers (a log call costs
~1 ms of host time), and the loggers, progress line and metrics.json get the same values as before."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from lightning.pytorch import LightningModule

import gte_pro.utils.progress as progress
from gte_pro.train import train

STEPS, EVERY = 7, 3


def _fit(make_cfg, out: Path, monkeypatch: pytest.MonkeyPatch, always_log: bool) -> tuple[list[dict], dict, list]:
    calls: list[tuple[int, str]] = []
    real_log = LightningModule.log

    def counting_log(self, name, value, *args, **kwargs):
        if name.startswith("train/"):
            calls.append((self.trainer.fit_loop.epoch_loop.batch_progress.current.ready, name))  # batch 1, 2, ...
        return real_log(self, name, value, *args, **kwargs)

    monkeypatch.setattr(LightningModule, "log", counting_log)
    if always_log:  # the old behaviour: every step
        for module in ("gte_pro.training.base_module", "gte_pro.training.guard", "gte_pro.training.callbacks"):
            monkeypatch.setattr(f"{module}.logs_this_step", lambda trainer: True)
    cfg = make_cfg(["debug=fast", "logger=csv", "callbacks=default", f"trainer.limit_train_batches={STEPS}",
                    f"trainer.log_every_n_steps={EVERY}", "eval.before=false", "export.hf=false",
                    "export.model_card=false"], output_dir=out)
    train(cfg)
    with open(out / "csv" / "version_0" / "metrics.csv") as f:
        rows = [row for row in csv.DictReader(f) if row.get("train/loss")]
    return rows, json.loads((out / "metrics.json").read_text()), calls


def test_step_metrics_are_logged_only_when_written_and_the_loggers_see_the_same(make_cfg, tmp_path, monkeypatch):
    rows, metrics, calls = _fit(make_cfg, tmp_path / "now", monkeypatch, always_log=False)
    monkeypatch.undo()
    old_rows, old_metrics, old_calls = _fit(make_cfg, tmp_path / "old", monkeypatch, always_log=True)

    # Lightning writes step metrics at steps 3, 6 (every EVERY optimizer steps): rows at step index 2 and 5
    assert [int(row["step"]) for row in rows] == [int(row["step"]) for row in old_rows] == [2, 5]
    logged_keys = {"train/loss", "train/acc", "train/sim_pos", "train/sim_neg", "train/skipped_steps",
                   "train/samples_per_s", "train/tokens_per_s"}
    assert logged_keys <= {key for key, value in rows[0].items() if value}
    # the same training (seeded per step): the same values reached the logger
    for row, old in zip(rows, old_rows, strict=True):
        assert float(row["train/loss"]) == pytest.approx(float(old["train/loss"]), rel=1e-5)
    # the log calls: every step before, only the written steps now
    assert {batch for batch, _ in old_calls} == set(range(1, STEPS + 1))
    assert {batch for batch, _ in calls} == {3, 6}
    # metrics.json holds the last step's values, not the last written step's
    assert metrics["global_step"] == STEPS
    assert metrics["train"]["train/loss"] == pytest.approx(old_metrics["train"]["train/loss"], rel=1e-5)
    assert metrics["train"]["train/samples_per_s"] > 0 and metrics["train"]["train/tokens_per_s"] > 0


def test_logs_this_step_without_a_trainer_is_true():
    assert progress.logs_this_step(None) is True
