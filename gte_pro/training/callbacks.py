"""Callbacks of our own: training throughput (progress bar, loggers, text log), a one-line progress bar, the
resumable last checkpoint, the record of each validation during fit, and the decontamination report."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Checkpoint, EarlyStopping, ModelCheckpoint, RichProgressBar
from lightning.pytorch.trainer.states import TrainerFn

from gte_pro.data.decontamination import REPORT
from gte_pro.launch.checkpoint_io import LAST
from gte_pro.utils.files import write_json_atomic
from gte_pro.utils.progress import logs_this_step

log = logging.getLogger(__name__)


class Throughput(Callback):
    """Samples/s and real (non-padding) tokens/s of the whole job, smoothed, measured between step ends.

    The interval between two step ends includes data loading and the optimizer, so it is the rate a user gets.
    Every ``print_every_n_steps`` a plain log line (step, loss, rates, ETA) is written too: a progress bar is
    invisible in a SLURM or CI log file.
    """

    def __init__(self, smoothing: float = 0.9, print_every_n_steps: int = 20) -> None:
        self.smoothing = smoothing
        self.print_every_n_steps = print_every_n_steps
        self._last: float | None = None
        self._samples_per_s: float | None = None
        self._tokens_per_s: float | None = None

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last = None  # the gap across validation is not training time

    def _smooth(self, old: float | None, new: float) -> float:
        return new if old is None else self.smoothing * old + (1 - self.smoothing) * new

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        now = time.perf_counter()
        if self._last is not None:
            elapsed = max(now - self._last, 1e-9)
            # a sample is a training row: (query, positive, k negatives), embedded or joined into 1 + k pairs
            rows = batch["rows"] if "rows" in batch else batch["query"]["input_ids"]
            samples = rows.shape[0] * trainer.world_size
            tokens = batch["num_tokens"] * trainer.world_size  # counted by the collator on the CPU: no device sync
            self._samples_per_s = self._smooth(self._samples_per_s, samples / elapsed)
            self._tokens_per_s = self._smooth(self._tokens_per_s, tokens / elapsed)
            if logs_this_step(trainer):
                pl_module.log("train/samples_per_s", self._samples_per_s, prog_bar=True, batch_size=1)
                pl_module.log("train/tokens_per_s", self._tokens_per_s, prog_bar=False, batch_size=1)
        self._last = now
        step = trainer.global_step
        if self.print_every_n_steps and step % self.print_every_n_steps == 0 and trainer.is_global_zero:
            self._print(trainer, pl_module, step)

    def rates(self) -> dict[str, float]:
        """The smoothed rates at the last step (the logged ones are refreshed every trainer.log_every_n_steps)."""
        rates = {"train/samples_per_s": self._samples_per_s, "train/tokens_per_s": self._tokens_per_s}
        return {name: float(value) for name, value in rates.items() if value is not None}

    def _print(self, trainer: Trainer, pl_module: LightningModule, step: int) -> None:
        total = trainer.estimated_stepping_batches
        # the module's own last value: the logged one is only refreshed every trainer.log_every_n_steps
        loss = getattr(pl_module, "train_metrics", lambda: {})().get("train/loss")
        rate = self._samples_per_s or 0.0
        steps_per_s = rate / max(trainer.datamodule.batch_size * trainer.world_size, 1) if trainer.datamodule else 0
        eta = (total - step) / steps_per_s if steps_per_s else float("nan")
        log.info("step %d/%d | loss %s | %.1f samples/s | %.0f tokens/s | eta %.0fs", step, total,
                 f"{float(loss):.4f}" if loss is not None else "-", rate, self._tokens_per_s or 0.0, eta)


class ProgressBar(RichProgressBar):
    """Lightning's Rich bar with one line of figures: step, loss, learning rate, samples/s and the last validation's
    NDCG@10, instead of every metric logged with ``prog_bar=True`` (a column that wraps on a terminal)."""

    def get_metrics(self, trainer: Trainer, pl_module: LightningModule) -> dict[str, int | str | float]:
        logged = trainer.progress_bar_metrics  # refreshed on the steps written to the loggers
        figures: dict[str, int | str | float] = {"step": trainer.global_step}
        if "train/loss" in logged:
            figures["loss"] = f"{float(logged['train/loss']):.4f}"
        if trainer.optimizers:
            figures["lr"] = f"{trainer.optimizers[0].param_groups[0]['lr']:.2e}"
        if "train/samples_per_s" in logged:
            figures["samples/s"] = f"{float(logged['train/samples_per_s']):.1f}"
        if "val/ndcg@10" in logged:
            figures["val/ndcg@10"] = f"{float(logged['val/ndcg@10']):.4f}"
        return figures


class ValidationRecord(Callback):
    """The val/* metrics of every validation during fit, by the global step it ran at. The final validation of
    the best checkpoint reuses them when that checkpoint's weights were validated in this process: it would only
    compute the same numbers again (10 s of the default run's 5 minutes)."""

    def __init__(self) -> None:
        self.by_step: dict[int, dict[str, float]] = {}

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != TrainerFn.FITTING:
            return
        self.by_step[trainer.global_step] = {name: float(value) for name, value in trainer.callback_metrics.items()
                                             if name.startswith("val/")}


TIME_CHECK_EVERY = 10  # optimizer steps between two checks of every_n_minutes


def ends_epoch(trainer: Trainer) -> bool:
    """Whether the batch just trained is its epoch's last: a checkpoint saved here (inside the epoch, before
    Lightning closes it) resumes correctly once, but Lightning's loop then never counts the next epoch as started,
    and every later checkpoint of that run resumes into the wrong batch indices (a resumed run's weights differ)."""
    return bool(trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)


class LastCheckpoint(Checkpoint):
    """``<dirpath>/last.ckpt``, the checkpoint a killed run resumes from: every ``every_n_steps`` optimizer steps
    and/or every ``every_n_minutes`` minutes, after every validation during fit, and when training ends (so that a
    kill during the exports does not train again). Written atomically by ``gte_pro.launch.checkpoint_io``.

    A save never lands between an optimizer step and the validation due right after it: Lightning restarts such a
    checkpoint as if that validation had run (it fast-forwards it), so the save waits for ``on_validation_end``.
    Nor after an epoch's last batch: a run resumed from there trains on correctly, but Lightning does not count the
    next epoch as started, so the checkpoints *that* run writes resume into the wrong batch indices; such a save
    comes one step later (``ends_epoch``). Under DDP every rank takes the same decision (steps are the same
    everywhere; the time is rank 0's, broadcast every ``TIME_CHECK_EVERY`` steps only, so a time-based save may come
    up to that many steps late).
    """

    def __init__(self, dirpath: str, every_n_steps: int | None = 100, every_n_minutes: float | None = 10.0) -> None:
        self.path = Path(dirpath) / LAST
        self.every_n_steps = every_n_steps or None
        self.every_n_seconds = every_n_minutes * 60 if every_n_minutes else None
        self._last_saved = time.monotonic()
        self._step_seen = -1
        self._pending = False  # due at an epoch's last batch: saved at the next step

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._last_saved = time.monotonic()
        self._step_seen = trainer.global_step

    def _save(self, trainer: Trainer) -> None:
        trainer.save_checkpoint(self.path)
        self._last_saved = time.monotonic()
        self._pending = False

    def _due(self, trainer: Trainer) -> bool:
        step = trainer.global_step
        if self.every_n_steps and step % self.every_n_steps == 0:
            return True
        if self.every_n_seconds is None or step % TIME_CHECK_EVERY:
            return False  # the clock is agreed on every TIME_CHECK_EVERY steps: a broadcast per step would sync DDP
        late = time.monotonic() - self._last_saved >= self.every_n_seconds
        return bool(trainer.strategy.broadcast(late))

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        stepped = trainer.global_step != self._step_seen  # False inside gradient accumulation
        self._step_seen = trainer.global_step
        if not stepped or not (self._due(trainer) or self._pending):  # _due first: its collective runs on every rank
            return
        epoch_loop = trainer.fit_loop.epoch_loop
        if epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher):
            return  # validation runs next: on_validation_end saves
        if ends_epoch(trainer):
            self._pending = True
            return
        self._save(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self._save(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._save(trainer)


def decide_before_last_checkpoint(callbacks: list[Callback]) -> list[Callback]:
    """``callbacks`` with every decision a validation leads to taken before ``LastCheckpoint`` saves that
    validation's state, so that a run resumed from that ``last.ckpt`` knows it.

    A monitoring ``ModelCheckpoint`` or ``EarlyStopping`` decides at validation end (Lightning's default after an
    epoch-end validation is the train-epoch end, after ``LastCheckpoint``'s save: a run killed in between resumed with
    no record of that validation's best checkpoint, and exported another model), and ``LastCheckpoint`` runs after
    them: Lightning moves checkpoint callbacks to the end of the list but keeps their order among themselves.
    """
    for callback in callbacks:
        if isinstance(callback, ModelCheckpoint) and callback.monitor is not None:
            callback._save_on_train_epoch_end = False
        if isinstance(callback, EarlyStopping):
            callback._check_on_train_epoch_end = False
    last = [callback for callback in callbacks if isinstance(callback, LastCheckpoint)]
    return [callback for callback in callbacks if not isinstance(callback, LastCheckpoint)] + last


class DecontaminationRecord(Callback):
    """``<run dir>/decontamination.json``: the overlap of the training rows with the evaluation sets
    (``data.decontaminate``, ``gte_pro.data.decontamination``), written once the data module has opened its rows,
    before the first validation or training step (Lightning sets the data module up before the callbacks)."""

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = Path(output_dir)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        report = getattr(trainer.datamodule, "decontamination", None)
        if report is not None and trainer.is_global_zero:
            write_json_atomic(self.output_dir / REPORT, report)
