"""Every checkpoint a run can leave resumes exactly: the run is stopped at each moment a ``last.ckpt`` can be the
newest one (mid-epoch, an epoch's last batch, after validation, before and after the best-checkpoint write, once
early stopping decided, over several epochs) and started again with the same config; the weights it trains, the
model it exports and its metrics equal the uninterrupted run's, bit for bit.

A stop is an exception raised by a callback (``tests.test_resume.Crash``): nothing cleans up after it, as after a kill
-9; the kill -9 and SIGTERM harnesses in subprocesses are tests/test_fault_injection.py (slow).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import Checkpoint

from gte_pro.train import train
from tests.test_resume import Crash, CrashAt, assert_same_run

# 4 batches an epoch, validation at each epoch's end, a last.ckpt after every optimizer step
RUN = ["debug=fast", "seed=3", "logger=none", "callbacks.progress_bar=null", "export.hf=false",
       "callbacks.last_checkpoint.every_n_steps=1", "trainer.max_epochs=2"]


class CrashAtEpochEnd(Callback):
    """After the epoch-end validation and every save it leads to, where Lightning closes the epoch."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer, *args) -> None:
        if trainer.current_epoch == self.epoch:
            raise Crash


class CrashAfterValidation(Callback):
    """After a validation, before any checkpoint of it is written (the checkpoint callbacks run last)."""

    def on_validation_end(self, trainer, *args) -> None:
        if not trainer.sanity_checking and trainer.global_step > 0:
            raise Crash


class CrashAfterBest(Checkpoint):
    """After the best-checkpoint write of the first validation, before last.ckpt records it: a Checkpoint, so
    Lightning runs it among the checkpoint callbacks, between ModelCheckpoint and LastCheckpoint."""

    def on_validation_end(self, trainer, *args) -> None:
        if not trainer.sanity_checking and trainer.global_step > 0:
            raise Crash


def crash(target: type, **options: int) -> list[str]:
    return [f"+callbacks.crash._target_={target.__module__}.{target.__name__}"] + \
        [f"+callbacks.crash.{key}={value}" for key, value in options.items()]


CASES = {  # name -> (the run's extra overrides, what stops it, the step of the last.ckpt it resumes from)
    "mid-epoch": ([], crash(CrashAt, step=6), 5),
    "epoch end, after the validation's saves": ([], crash(CrashAtEpochEnd), 4),
    "after validation, before its saves": ([], crash(CrashAfterValidation), 3),
    "after the best checkpoint, before last.ckpt": ([], crash(CrashAfterBest), 3),
    "second epoch's end, three epochs": (["trainer.max_epochs=3"], crash(CrashAtEpochEnd, epoch=1), 8),
    "early stopping decided": (["trainer.max_epochs=3", "callbacks.early_stopping.patience=0",
                                "callbacks.early_stopping.min_delta=1.0"], crash(CrashAtEpochEnd, epoch=1), 8),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_run_stopped_at_each_checkpoint_moment_resumes_to_the_same_run(make_cfg, tmp_path: Path, case: str):
    extra, stop, resumed_step = CASES[case]
    run = [*RUN, *extra]
    reference = tmp_path / "reference"
    train(make_cfg(run, output_dir=reference))
    stopped = tmp_path / "stopped"
    with pytest.raises(Crash):
        train(make_cfg([*run, *stop], output_dir=stopped))
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == resumed_step
    train(make_cfg(run, output_dir=stopped))
    assert_same_run(stopped, reference)
    restarts = json.loads((stopped / "metrics.json").read_text())["restarts"]
    assert [r["step"] for r in restarts] == [resumed_step]


def test_every_decision_of_a_validation_comes_before_the_last_checkpoint_records_it():
    """Lightning's default after an epoch-end validation is to decide the best checkpoint and early stopping at the
    train-epoch end, after LastCheckpoint's save; and a config may list last_checkpoint first."""
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint

    from gte_pro.training.callbacks import LastCheckpoint, decide_before_last_checkpoint

    last = LastCheckpoint("unused")
    best, every_epoch = ModelCheckpoint(monitor="val/ndcg@10"), ModelCheckpoint(save_on_train_epoch_end=True)
    stopping = EarlyStopping(monitor="val/ndcg@10", check_on_train_epoch_end=True)
    ordered = decide_before_last_checkpoint([last, best, stopping, every_epoch])
    assert ordered == [best, stopping, every_epoch, last]
    assert best._save_on_train_epoch_end is False and stopping._check_on_train_epoch_end is False
    assert every_epoch._save_on_train_epoch_end is True  # no monitor: it saves each epoch, validated or not
