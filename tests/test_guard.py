"""The non-finite guard (gte_pro.training.guard): a NaN loss or gradient skips exactly that optimizer step, is counted
and logged; too many stop the run with the step, the batch's rows and a dump of the batch."""

from __future__ import annotations

import csv
import json
import math
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback
from torch.utils.data import DataLoader

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_loss
from gte_pro.modes.build import build_datamodule, build_encoder, build_module, build_trainer, seed_and_precision
from gte_pro.training.guard import NonFiniteGuard, NonFiniteLossError
from gte_pro.training.losses import LossOutput
from gte_pro.training.module import ContrastiveModule


class _NanGradient(torch.autograd.Function):
    """Identity forward, NaN backward: a finite loss whose gradients are not."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad * float("nan")


def poison(out: LossOutput, kind: str) -> LossOutput:
    if kind == "loss":  # NaN loss, and through it NaN gradients
        return LossOutput(out.loss * float("nan"), out.scores, out.labels)
    if kind == "grad":  # finite loss, NaN gradients
        return LossOutput(_NanGradient.apply(out.loss), out.scores, out.labels)
    if kind == "loss-only":  # NaN loss, finite gradients (a constant that backward never reaches)
        return LossOutput(out.loss + torch.tensor(float("nan"), device=out.loss.device), out.scores, out.labels)
    raise ValueError(kind)


def poison_calls(monkeypatch: pytest.MonkeyPatch, calls: set[int], kind: str = "loss") -> list[int]:
    """Poison the training loss of these training_step calls (0-based); returns the call counter."""
    counter = [0]
    real = ContrastiveModule._contrastive_loss

    def patched(self: ContrastiveModule, batch: dict[str, Any]) -> LossOutput:
        out = real(self, batch)
        counter[0] += 1
        return poison(out, kind) if counter[0] - 1 in calls else out

    monkeypatch.setattr(ContrastiveModule, "_contrastive_loss", patched)
    return counter


class StepSpy(Callback):
    """Per optimizer step: did the weights change, AdamW's step count, the rows and batch the step trained on."""

    def __init__(self) -> None:
        self.changed: list[bool] = []
        self.adam_steps: list[int] = []
        self.rows: list[list[int]] = []
        self.batches: list[dict[str, Any]] = []

    def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, batch_idx: int) -> None:
        self.before = {name: p.detach().clone() for name, p in module.named_parameters()}
        self.rows.append(batch["rows"].tolist())
        self.batches.append(batch)

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        self.changed.append(any(not torch.equal(p, self.before[n]) for n, p in module.named_parameters()))
        state = trainer.optimizers[0].state
        self.adam_steps.append(max((int(s["step"]) for s in state.values()), default=0))


def fit(make_cfg: Any, out: Path, overrides: list[str], spy: StepSpy) -> tuple[Any, ContrastiveModule]:
    """A `debug=fast` fit (4 steps of 8 demo pairs) without validation, built as `python train.py` builds it."""
    from hydra.utils import instantiate

    cfg = make_cfg(["debug=fast", "logger=csv", "callbacks=none", "+trainer.limit_val_batches=0",
                    "+trainer.enable_progress_bar=false", *overrides], output_dir=out)
    seed_and_precision(cfg)
    encoder = build_encoder(cfg)
    datamodule = build_datamodule(cfg, encoder.tokenizer)
    module = build_module(cfg, encoder)
    trainer = build_trainer(cfg, [spy], [instantiate(cfg.logger.csv)])
    trainer.fit(module, datamodule=datamodule)
    return trainer, module


def logged(out: Path, key: str) -> list[float]:
    with open(next(out.glob("csv/version_*/metrics.csv"))) as handle:
        return [float(row[key]) for row in csv.DictReader(handle) if row.get(key)]


@pytest.mark.parametrize(("kind", "mini_batch_size"), [("loss", None), ("grad", None), ("loss", 4)],
                         ids=["nan-loss", "nan-gradient", "nan-loss-gradcache"])
def test_a_nan_step_is_skipped_and_counted_and_the_run_goes_on(make_cfg, tmp_path, monkeypatch, kind,
                                                               mini_batch_size):
    calls = poison_calls(monkeypatch, {1}, kind)
    spy = StepSpy()
    trainer, module = fit(make_cfg, tmp_path / "run", [f"loss.mini_batch_size={mini_batch_size or 'null'}"], spy)
    assert calls[0] == 4
    # exactly the second step left the weights and AdamW's state (its step count) as they were
    assert spy.changed == [True, False, True, True]
    assert spy.adam_steps == [1, 1, 2, 3]
    assert all(torch.isfinite(p).all() for p in module.parameters())
    assert module.guard.skipped == 1
    assert logged(tmp_path / "run", "train/skipped_steps") == [0.0, 1.0, 1.0, 1.0]
    # a skipped step is still a step: global_step and the step-interval scheduler advance (as after a GradScaler
    # overflow), so max_steps and the schedule's length keep counting batches
    assert trainer.global_step == 4
    assert trainer.lr_scheduler_configs[0].scheduler.last_epoch == 4


def test_past_max_skipped_steps_the_run_stops_naming_the_step_and_rows_with_a_dump(make_cfg, tmp_path, monkeypatch):
    poison_calls(monkeypatch, {1, 2})
    out, spy = tmp_path / "run", StepSpy()
    with pytest.raises(NonFiniteLossError) as error:
        fit(make_cfg, out, ["loss.max_skipped_steps=1"], spy)
    message = str(error.value)
    dump = out / "nonfinite" / "step000002-rank0.pt"
    assert "global step 2" in message and "2 non-finite steps in this run, more than loss.max_skipped_steps=1 " \
        "allows" in message and str(dump) in message
    saved = torch.load(dump, weights_only=True)
    details = json.loads(dump.with_suffix(".json").read_text())
    rows = spy.rows[2]  # the third step's batch: the second NaN, one more than allowed
    assert saved["rows"] == rows and len(rows) == 8 and f"batch rows {rows}" in message
    assert details["global_step"] == 2 and details["rows"] == rows and details["rank"] == 0
    assert details["losses"] == ["nan"] and details["skipped_steps"] == 2 and details["max_skipped_steps"] == 1
    # the dump holds the very tensors of the offending batch
    [batch] = saved["batches"]
    for key in ("query", "doc"):
        for name, tensor in spy.batches[2][key].items():
            assert torch.equal(batch[key][name], tensor), (key, name)
    assert batch["rows"].tolist() == rows and batch["num_negatives"] == spy.batches[2]["num_negatives"]
    # the first NaN was skipped and logged, the second stopped the run before its step
    assert spy.changed == [True, False]
    assert not list(out.glob("nonfinite/*.tmp*"))


def test_accumulated_micro_batches_are_all_checked(make_cfg, tmp_path, monkeypatch):
    """A NaN in the first of two accumulated batches (which never reaches optimizer_step's closure) skips the step."""
    poison_calls(monkeypatch, {0}, "loss-only")  # NaN loss, finite gradients: only the loss check can see it
    spy = StepSpy()
    trainer, module = fit(make_cfg, tmp_path / "run", ["trainer.accumulate_grad_batches=2"], spy)
    assert trainer.global_step == 2 and module.guard.skipped == 1
    assert spy.changed == [False, False, False, True]
    assert spy.adam_steps == [0, 0, 0, 1]


# --- fp16: the GradScaler's job ---------------------------------------------------------------------------------------
ROWS = [(f"question {i} about subject {i * 7}", f"an answer to question {i}, on subject {i * 7}", [])
        for i in range(6)]
TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}


def _small_fit(steps: int = 2, **trainer_options: Any) -> ContrastiveModule:
    from lightning.pytorch import Trainer

    from gte_pro.data.collate import PairCollator
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=32)
    module = ContrastiveModule(encoder=encoder, loss=default_loss("infonce", max_skipped_steps=5),
                               optimizer=torch.optim.AdamW, lr=1e-3)
    loader = DataLoader(ROWS, batch_size=3, collate_fn=PairCollator(encoder.tokenizer, encoder.max_length))
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, max_steps=steps,
                      enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0, **trainer_options)
    trainer.fit(module, train_dataloaders=loader)
    return module


@pytest.mark.parametrize("kind", ["grad", "loss"])
def test_with_a_grad_scaler_only_the_loss_is_checked(monkeypatch, kind):
    """16-mixed: inf/NaN gradients are fp16 overflow, which the scaler skips (lowering its scale); the guard leaves
    them alone. A NaN loss no scale can fix: the guard skips and counts it, and the scale stays."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    poison_calls(monkeypatch, {0}, kind)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
    # Trainer(precision="16-mixed") falls back to bf16 on a CPU: the plugin forces fp16 autocast + GradScaler
    module = _small_fit(plugins=[MixedPrecision("16-mixed", "cpu", scaler)])
    if kind == "grad":
        assert module.guard.skipped == 0 and scaler.get_scale() == 2.0**11
    else:
        assert module.guard.skipped == 1 and scaler.get_scale() == 2.0**12




def test_the_count_goes_into_checkpoints():
    guard = NonFiniteGuard(3)
    guard.skipped = 2
    resumed = NonFiniteGuard(3)
    resumed.load_state_dict(guard.state_dict())
    assert resumed.skipped == 2


def test_the_config_sets_the_limit(make_cfg):
    cfg = make_cfg(["debug=fast", "loss=gte", "loss.max_skipped_steps=3"])
    assert build_module(cfg, build_encoder(cfg)).guard.max_skipped_steps == 3


# --- DDP: every rank takes the same decision -------------------------------------------------------------------------
class _RankPoisoned(ContrastiveModule):
    """Rank 1's loss is NaN at its second step, its gradients finite: only the loss check can see it, and only on
    rank 1. Each rank saves its weights and optimizer step count after every step."""

    def __init__(self, *args: Any, out: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out
        self.record: list[dict[str, Any]] = []

    def _contrastive_loss(self, batch: dict[str, Any]) -> LossOutput:
        out = super()._contrastive_loss(batch)
        return poison(out, "loss-only") if self.global_rank == 1 and self.global_step == 1 else out

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        state = self.trainer.optimizers[0].state
        self.record.append({"weights": torch.cat([p.detach().flatten() for p in self.parameters()]).clone(),
                            "adam_steps": max(int(s["step"]) for s in state.values()),
                            "skipped": self.guard.skipped})
        torch.save(self.record, f"{self.out}.{self.global_rank}")


def test_one_ranks_nan_skips_the_step_on_both_ranks(tmp_path: Path):
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import DDPStrategy

    from gte_pro.data.collate import PairCollator
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=32)
    out = str(tmp_path / "rank")
    module = _RankPoisoned(encoder=encoder, loss=default_loss("infonce"), optimizer=torch.optim.AdamW, lr=1e-3, out=out)
    loader = DataLoader(ROWS * 2, batch_size=2, collate_fn=PairCollator(encoder.tokenizer, encoder.max_length))
    trainer = Trainer(accelerator="cpu", devices=2, max_steps=3, logger=False,
                      strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=120)),
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)
    ranks = [torch.load(f"{out}.{rank}", weights_only=True) for rank in range(2)]
    for record in ranks:
        assert [step["adam_steps"] for step in record] == [1, 1, 2]
        assert [step["skipped"] for step in record] == [0, 1, 1]
        assert torch.equal(record[0]["weights"], record[1]["weights"])  # the skipped step changed nothing
        assert not torch.equal(record[1]["weights"], record[2]["weights"])
    for step in range(3):  # the ranks never diverged
        assert torch.equal(ranks[0][step]["weights"], ranks[1][step]["weights"])


def test_json_numbers_are_strict():
    from gte_pro.training.guard import _number

    assert _number(1.5) == 1.5 and _number(math.nan) == "nan" and _number(math.inf) == "inf"
