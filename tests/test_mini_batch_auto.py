"""``loss.mini_batch_size=auto`` (issue 33): the GradCache mini-batch chosen from the memory plan before the model
loads (gte_pro/preflight/auto_mini_batch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gte_pro.config.checks import check_config
from gte_pro.config.resolve import uses_cuda
from gte_pro.errors import ConfigError
from gte_pro.modes.prepare import prepare
from gte_pro.preflight.auto_mini_batch import RECORD, choose, largest_fitting
from gte_pro.preflight.memory_budget import MemoryBudgetError, judged, with_mini_batch
from gte_pro.preflight.memory_estimate import GIB, meta_backbone, shape_of
from gte_pro.preflight.per_device import setup_of

LOGGER = "gte_pro.preflight.auto_mini_batch"
# the tiny BERT, batch 32 x (query, positive, 1 negative): activations are most of the peak
RUN = ["debug=fast", "data.batch_size=32", "data.num_negatives=1", "logger=none", "export.hf=false"]


def plan_memory(cfg, run_folder: Path | None = None, resumed: bool = False):
    """The memory plan a run makes before its model loads (the pre-flight on the run's data module); the
    ``loss.mini_batch_size=auto`` choice settled in ``cfg``, as the run settles it."""
    return prepare(cfg, run_folder, resumed)[1].memory


def _auto(make_cfg, budget: float | None, *extra: str, output_dir: Path | None = None):
    value = "null" if budget is None else f"{budget / GIB:.6f}"
    return make_cfg([*RUN, "loss.mini_batch_size=auto", f"trainer.memory_budget={value}", *extra],
                    output_dir=output_dir)


def _peak(cfg, mini_batch: int | None) -> float:
    """The estimate the plan judges for ``cfg`` (the data's largest batch) at ``loss.mini_batch_size=mini_batch``."""
    from gte_pro.modes.build import build_data_before_model
    from gte_pro.preflight.batch_lengths import batch_lengths

    cuda = uses_cuda(cfg)
    data = batch_lengths(cfg, build_data_before_model(cfg), cuda)
    setup = setup_of(cfg, cuda, data.datamodule.num_negatives if data is not None else None)
    shape = shape_of(meta_backbone(cfg.model))
    return judged(shape, with_mini_batch(setup, mini_batch), data)[0].peak


def _messages(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_largest_fitting_is_the_last_fit_before_the_first_miss():
    assert largest_fitting(lambda m: m <= 37, 100) == 37
    assert largest_fitting(lambda m: m <= 500, 100) == 100
    assert largest_fitting(lambda m: False, 100) is None
    assert largest_fitting(lambda m: True, 1) == 1


def test_choose_says_null_under_fsdp_and_without_a_budget():
    def peak(m: int | None) -> float:
        return 10.0 if m is None else float(m)

    assert choose(peak, 64, 5.5, "budget", fsdp=True).value is None  # the batch would not fit: still no GradCache
    assert "strategy=fsdp" in choose(peak, 64, 5.5, "budget", fsdp=True).why
    assert choose(peak, 64, None, "budget", fsdp=False).value is None
    assert choose(peak, 64, 5.5, "budget", fsdp=False).value == 5
    assert choose(peak, 64, 10.0, "budget", fsdp=False).value is None
    assert not choose(peak, 64, 0.5, "budget", fsdp=False).fits


def test_auto_is_a_valid_value_and_others_are_refused(make_cfg):
    check_config(make_cfg(["loss.mini_batch_size=auto"]))
    with pytest.raises(ConfigError, match="loss.mini_batch_size"):
        check_config(make_cfg(["loss.mini_batch_size=lots"]))



def test_an_unresolved_auto_builds_an_uncached_loss(make_cfg):
    """mode=eval builds the module without a training step to size: auto is no GradCache there."""
    from gte_pro.modes.build import module_config

    assert module_config(make_cfg(["loss.mini_batch_size=auto"]))["loss"]["mini_batch_size"] is None
    assert module_config(make_cfg(["loss.mini_batch_size=16"]))["loss"]["mini_batch_size"] == 16

def test_auto_keeps_the_whole_batch_where_it_fits(make_cfg, caplog):
    with caplog.at_level("INFO", logger=LOGGER):
        cfg = _auto(make_cfg, 64 * GIB)
        plan_memory(cfg)
    assert cfg.loss.mini_batch_size is None
    assert "loss.mini_batch_size=auto: null (the whole batch fits in one forward: estimate" in _messages(caplog)


def test_auto_without_a_budget_is_one_forward(make_cfg, caplog):
    with caplog.at_level("INFO", logger=LOGGER):
        cfg = _auto(make_cfg, None)
        plan_memory(cfg)
    assert cfg.loss.mini_batch_size is None and "trainer.memory_budget=null" in _messages(caplog)


def test_auto_picks_the_largest_mini_batch_that_fits(make_cfg, caplog):
    """A budget below the whole batch's estimate: the mini-batch picked fits by the estimate, one more text per
    forward does not, and the plan that the run prints (and judges) is that of the mini-batch."""
    whole = plan_memory(_auto(make_cfg, None)).peak
    budget = round(0.7 * whole / GIB, 6) * GIB
    with caplog.at_level("INFO", logger=LOGGER):
        cfg = _auto(make_cfg, budget)
        plan = plan_memory(cfg)
    chosen = cfg.loss.mini_batch_size
    assert isinstance(chosen, int) and 1 <= chosen < 32 * 3
    assert _peak(cfg, chosen) <= budget < _peak(cfg, chosen + 1)
    assert plan.peak == pytest.approx(_peak(cfg, chosen)) and plan.replay_gradients > 0
    assert f"loss.mini_batch_size=auto: {chosen} (estimate " in _messages(caplog)
    assert "the whole batch in one forward would need" in _messages(caplog)


def test_auto_refuses_with_options_where_nothing_fits(make_cfg):
    with pytest.raises(MemoryBudgetError) as refused:
        plan_memory(_auto(make_cfg, 0.01 * GIB))
    lines = str(refused.value).splitlines()
    assert lines[0].startswith("loss.mini_batch_size=auto: not even 1 text per forward fits within 10 MiB")
    assert lines[1].startswith("this run needs about")


def test_auto_is_null_under_fsdp(make_cfg, caplog):
    with caplog.at_level("INFO", logger=LOGGER):
        cfg = _auto(make_cfg, 64 * GIB, "strategy=fsdp", "devices=2")
        plan_memory(cfg)
    assert cfg.loss.mini_batch_size is None and "strategy=fsdp" in _messages(caplog)


def test_a_resumed_run_reuses_the_first_choice(make_cfg, tmp_path: Path, caplog):
    """The first start keeps its choice in the run folder; a resume under another budget (another machine) reuses
    it, so that it sums the same mini-batches; a fresh start in the folder chooses again."""
    folder = tmp_path / "run"
    whole = plan_memory(_auto(make_cfg, None)).peak
    first = _auto(make_cfg, 0.7 * whole, output_dir=folder)
    plan_memory(first, folder)
    chosen = first.loss.mini_batch_size
    assert json.loads((folder / RECORD).read_text())["mini_batch_size"] == chosen and chosen
    with caplog.at_level("INFO", logger=LOGGER):
        resumed = _auto(make_cfg, 64 * GIB, output_dir=folder)
        plan_memory(resumed, folder, resumed=True)
    assert resumed.loss.mini_batch_size == chosen
    assert f"loss.mini_batch_size=auto: {chosen}, as this run chose at its start" in _messages(caplog)
    fresh = _auto(make_cfg, 64 * GIB, output_dir=folder)
    plan_memory(fresh, folder)
    assert fresh.loss.mini_batch_size is None
    assert json.loads((folder / RECORD).read_text())["mini_batch_size"] is None


def test_the_chosen_mini_batch_reaches_the_loss(make_cfg, tmp_path: Path, monkeypatch):
    """A short run with auto under a budget the whole batch does not fit: every step is the cached loss at the
    chosen mini-batch, which the run folder keeps."""
    import gte_pro.training.module as module
    from gte_pro.train import train

    seen = []
    original = module.cached_loss

    def recording(*args, **kwargs):
        seen.append(args[5])  # mini_batch_size
        return original(*args, **kwargs)

    monkeypatch.setattr(module, "cached_loss", recording)
    whole = plan_memory(_auto(make_cfg, None)).peak
    out = tmp_path / "run"
    train(_auto(make_cfg, 0.7 * whole, "eval.before=false", "trainer.limit_train_batches=1", output_dir=out))
    chosen = json.loads((out / RECORD).read_text())["mini_batch_size"]
    assert chosen and seen and set(seen) == {chosen}


@pytest.mark.slow
def test_a_run_resumed_under_another_budget_trains_to_the_same_weights(make_cfg, tmp_path: Path):
    """Stopped at step 7 (checkpoint at 6) and resumed where the budget would pick another mini-batch (the whole
    batch): the resume reuses the first choice, and ends bit-identical to the uninterrupted run."""
    from gte_pro.train import train
    from tests.test_resume import Crash, assert_same_run

    run = [*RUN, "data.max_train_rows=256", "trainer.limit_train_batches=null", "callbacks.progress_bar=null",
           "callbacks.last_checkpoint.every_n_steps=2", "trainer.val_check_interval=5", "loss.mini_batch_size=auto"]
    whole = plan_memory(make_cfg([*run, "trainer.memory_budget=null"])).peak
    tight = [*run, f"trainer.memory_budget={0.7 * whole / GIB:.6f}"]
    reference, stopped = tmp_path / "reference", tmp_path / "stopped"
    train(make_cfg(tight, output_dir=reference))
    chosen = json.loads((reference / RECORD).read_text())["mini_batch_size"]
    assert chosen
    with pytest.raises(Crash):
        train(make_cfg([*tight, "+callbacks.crash._target_=tests.test_resume.CrashAt", "+callbacks.crash.step=7"],
                       output_dir=stopped))
    train(make_cfg([*run, "trainer.memory_budget=64"], output_dir=stopped))
    assert json.loads((stopped / RECORD).read_text())["mini_batch_size"] == chosen
    assert_same_run(stopped, reference)
