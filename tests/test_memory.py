"""Memory planning (gte_pro.preflight.memory_estimate, memory_budget): the estimate against the measured peak of
real training steps on the CPU (every live tensor counted), the refusal and its options, and the record in
metrics.json."""

from __future__ import annotations

import importlib.util
import json
import shlex
import sys
from pathlib import Path

import pytest
import torch

from gte_pro.errors import ConfigError
from gte_pro.modes.prepare import prepare
from gte_pro.preflight.memory_budget import MemoryBudgetError
from gte_pro.preflight.memory_estimate import GIB, Setup, estimate, meta_backbone, shape_of
from gte_pro.preflight.per_device import setup_of
from gte_pro.utils.live_bytes import LiveBytes
from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark scripts import their siblings
_spec = importlib.util.spec_from_file_location("bench_memory", REPO / "benchmarks" / "bench_memory.py")
bench_memory = importlib.util.module_from_spec(_spec)
sys.modules["bench_memory"] = bench_memory
_spec.loader.exec_module(bench_memory)

FAST = [("bert", "fp32"), ("qwen2", "bf16"), ("qwen2", "checkpointing"), ("modernbert", "lora"),
        ("bert", "gradcache")]
ALL = [(family, check) for family in bench_memory.FAMILY for check in bench_memory.CHECKS]


def plan_memory(cfg, run_folder: Path | None = None, resumed: bool = False):
    """The memory plan a run makes before its model loads (the pre-flight on the run's data module); the
    ``loss.mini_batch_size=auto`` choice settled in ``cfg``, as the run settles it."""
    return prepare(cfg, run_folder, resumed)[1].memory


def test_live_bytes_counts_each_storage_once_until_it_is_freed():
    with LiveBytes() as counter:
        a = torch.zeros(1024, 256)  # 1 MiB
        view = a[:10]
        b = a * 2
        assert counter.live == 2 * 2**20
        del a, b
        assert counter.live == 2**20  # the view keeps its storage alive
        del view
        assert counter.live == 0 and counter.peak == 2 * 2**20


def _check_estimate(family: str, check: str) -> None:
    cfg = bench_memory.compose(bench_memory.check_overrides(family, check))
    estimated, measured = bench_memory.estimated_peak(cfg), bench_memory.measured_peak(cfg)
    assert 0.85 <= estimated / measured <= 1.3, (family, check, estimated / 2**20, measured / 2**20)


@pytest.mark.parametrize(("family", "check"), FAST)
def test_the_estimate_is_within_the_measured_peak_of_real_steps(family: str, check: str):
    """Two training steps of each family's tiny config at full length, with every live tensor counted: the estimate
    lies within 0.85-1.3x of the measured peak (``make bench-memory`` prints them all)."""
    _check_estimate(family, check)


@pytest.mark.slow
@pytest.mark.parametrize(("family", "check"), [pair for pair in ALL if pair not in FAST])
def test_the_estimate_is_within_the_measured_peak_for_every_family_and_option(family: str, check: str):
    _check_estimate(family, check)


def test_sharding_divides_the_states_and_adds_the_gathered_blocks():
    cfg = bench_memory.compose(["model=tiny_qwen2"])
    shape = shape_of(meta_backbone(cfg.model))
    one = estimate(shape, Setup(precision="bf16-mixed", texts=8, tokens_per_text=64, cuda=True))
    four = estimate(shape, Setup(precision="bf16-mixed", texts=8, tokens_per_text=64, cuda=True, shards=4))
    for part in ("weights", "gradients", "optimizer", "step_temporaries"):
        assert getattr(four, part) == pytest.approx(getattr(one, part) / 4), part
    assert four.activations == one.activations and four.gathered == 2 * 2 * shape.largest_block
    assert shape.largest_block > 0 and shape.gated_mlp and shape.layers == 2


def test_a_seven_billion_decoder_does_not_fit_one_gpu_in_full_and_does_with_lora_and_checkpointing():
    """The published gte-Qwen2-7B shape (meta device: nothing is downloaded or allocated)."""
    preset, fields = bench_memory.GTE["gte-Qwen2-7B"]
    base = [preset, *bench_memory._fields(fields), "trainer.precision=bf16-mixed", "data.batch_size=8",
            "data.max_length=512"]
    full = setup_of(bench_memory.compose(base), cuda=True)
    shape = shape_of(meta_backbone(bench_memory.compose(base).model))
    assert 7.0e9 < shape.parameters < 7.7e9
    # AdamW in fp32: weights, gradients and two moments alone are 16 bytes a parameter
    assert estimate(shape, full).peak > 16 * shape.parameters > 80 * GIB
    light = bench_memory.compose([*base, "model.gradient_checkpointing=true", "model.lora={r: 16}"])
    assert bench_memory.estimated_peak(light, cuda=True) < 80 * GIB


def test_a_run_that_does_not_fit_is_refused_with_options_that_do(make_cfg):
    cfg = make_cfg(["debug=fast", "trainer.memory_budget=0.04"])
    with pytest.raises(MemoryBudgetError) as refused:
        plan_memory(cfg)
    message = str(refused.value)
    assert "more than 41 MiB (trainer.memory_budget=0.04)" in message
    options = [line.rsplit(" (", 1)[0] for line in message.splitlines()[2:]]
    assert "model.lora='{r: 16}'" in options  # the optimizer step, not the short demo texts, is what does not fit
    for option in options:  # each option, as a shell would pass it, passes the same check
        assert plan_memory(make_cfg(["debug=fast", "trainer.memory_budget=0.04", *shlex.split(option)])) is not None
    assert plan_memory(make_cfg(["debug=fast", "trainer.memory_budget=null"])) is not None  # never refuses


def test_memory_budget_values_are_checked(make_cfg):
    from gte_pro.config.checks import check_config

    with pytest.raises(ConfigError, match="trainer.memory_budget"):
        check_config(make_cfg(["trainer.memory_budget=lots"]))
    check_config(make_cfg(["trainer.memory_budget=12.5"]))


def test_a_run_records_its_estimate_made_on_its_one_data_module(make_cfg, tmp_path: Path, monkeypatch):
    """The estimate is in metrics.json, and was made on the data module the run trained on: one data module is
    built in the whole run (issue 42: the memory plan built a second one before the model loaded)."""
    from gte_pro.data.base import ContrastiveDataModule
    from gte_pro.train import train

    built = []
    original = ContrastiveDataModule.__init__

    def counted(self, *args, **kwargs):
        built.append(args[0].module_name)  # the row source: one data module of data=demo
        original(self, *args, **kwargs)

    monkeypatch.setattr(ContrastiveDataModule, "__init__", counted)
    out = tmp_path / "run"
    train(make_cfg(["debug=fast", "logger=none", "export.hf=false"], output_dir=out))
    memory = json.loads((out / "metrics.json").read_text())["memory"]
    assert memory["estimated_peak"] > 0 and memory["activations"] > 0 and memory["context"] == 0
    assert memory["full_length_peak"] > 0  # judged on the data's batches, read from that module's token cache
    assert built == ["DemoDataModule"]


# --- the plan judges the batches the data will make (issue 34) ------------------------------------------------------
@pytest.mark.parametrize("kind", bench_memory.DATA_KINDS)
def test_the_data_based_estimate_is_within_the_measured_peak_of_the_datas_batches(kind: str, tmp_path: Path):
    """Epoch 0 of a file of short, mixed or long texts, every batch through the training module's loss (length
    chunks as on the CPU) with every live tensor counted: the plan for the data's largest batch lies within
    0.85-1.3x of the measured peak. Short and mixed texts need far less than the full-length worst case."""
    train_file = bench_memory.write_texts(tmp_path / f"{kind}.jsonl", 96, kind)
    cfg = bench_memory.compose(bench_memory.data_overrides(train_file, tmp_path / "cache"))
    (estimated, worst), measured = bench_memory.planned_peak(cfg), bench_memory.measured_data_peak(cfg)
    assert 0.85 <= estimated / measured <= 1.3, (kind, estimated / 2**20, measured / 2**20)
    if kind != "long":
        assert estimated < 0.7 * worst, (kind, estimated / 2**20, worst / 2**20)


@pytest.mark.slow
@pytest.mark.parametrize("check", ["one block"])
def test_the_data_based_estimate_holds_in_one_padded_block(check: str, tmp_path: Path):
    train_file = bench_memory.write_texts(tmp_path / "mixed.jsonl", 96, "mixed")
    cfg = bench_memory.compose(bench_memory.data_overrides(train_file, tmp_path / "cache",
                                                           bench_memory.DATA_CHECKS[check]))
    estimated, measured = bench_memory.planned_peak(cfg)[0], bench_memory.measured_data_peak(cfg)
    assert 0.85 <= estimated / measured <= 1.3, (check, estimated / 2**20, measured / 2**20)


def _mined_run(make_cfg, tmp_path: Path, budget: float | None, *extra: str):
    """The issue's run, scaled down: mixed texts, 7 negatives per query, the tiny BERT at 256 tokens."""
    train_file = bench_memory.write_texts(tmp_path / "mined.jsonl", 128, "mixed", negatives=7)
    budget_value = "null" if budget is None else budget
    return make_cfg(["model=tiny", "data=jsonl", f"data.train_file={train_file}", "data.num_negatives=7",
                     "data.batch_size=8", "data.max_length=256", f"trainer.memory_budget={budget_value}", *extra])


def test_a_run_whose_batches_fit_starts_though_full_length_texts_would_not(make_cfg, tmp_path: Path, caplog):
    """The budget lies between the data's largest batch and 72 texts at 256 tokens: the run starts, and says which
    batch is the largest and what the full-length worst case would need (before issue 34 it was refused)."""
    plan = plan_memory(_mined_run(make_cfg, tmp_path, None))
    assert plan.full_length_peak > 2 * plan.peak
    budget = (plan.peak + plan.full_length_peak) / 2 / GIB
    with caplog.at_level("INFO", logger="gte_pro.preflight.run"):
        started = plan_memory(_mined_run(make_cfg, tmp_path, budget))
    assert started.peak == pytest.approx(plan.peak)
    printed = "\n".join(r.getMessage() for r in caplog.records)
    assert "estimated for this data's largest batch, step " in printed and "documents " in printed
    assert "at full length (the worst case, 72 texts x 256 tokens per forward)" in printed
    assert "memory: starting, as this data's largest batch" in printed


def test_a_run_whose_largest_batch_does_not_fit_is_refused_with_options_that_do(make_cfg, tmp_path: Path):
    plan = plan_memory(_mined_run(make_cfg, tmp_path, None))
    budget = round(plan.peak * 0.8 / GIB, 4)
    with pytest.raises(MemoryBudgetError) as refused:
        plan_memory(_mined_run(make_cfg, tmp_path, budget))
    message = str(refused.value)
    assert "for its largest batch (step " in message.splitlines()[0]
    options = [line.rsplit(" (", 1)[0] for line in message.splitlines()[2:]]
    assert "model.gradient_checkpointing=true" in options
    for option in options:  # judged on the same data's batches: each passes the same check
        assert plan_memory(_mined_run(make_cfg, tmp_path, budget, *shlex.split(option))) is not None


def test_the_plan_draws_the_lengths_the_training_loader_batches(make_cfg, tmp_path: Path):
    """The lengths the plan reads (token cache, the dataset's draw, the sampler's batches) are those of the batches
    the training loader makes."""
    from gte_pro.modes.build import build_data_before_model
    from gte_pro.preflight.batch_lengths import batch_lengths

    cfg = _mined_run(make_cfg, tmp_path, None)
    datamodule = build_data_before_model(cfg)  # the run's one data module: the plan reads it, the run trains on it
    data = batch_lengths(cfg, datamodule, cuda=False)
    datamodule.prepare_data()
    datamodule.setup("fit")
    for rows, batch in zip(data.steps(8), datamodule.train_dataloader(), strict=True):
        query, docs = data.forwards(rows, None)
        assert query.tolist() == batch["query"]["attention_mask"].sum(1).tolist()
        assert docs.tolist() == batch["doc"]["attention_mask"].sum(1).tolist()


# --- GradCache at large batches: the loss's share, and what loss.mini_batch_size=auto picks (issue 33) --------------
@pytest.mark.parametrize(("batch", "mini_batch"), [(64, 16)])
def test_the_cached_step_estimate_is_within_the_measured_peak_of_the_cached_loss(batch: int, mini_batch: int):
    """Two steps through the project's cached loss (its replay buffers included) at a batch whose score matrix
    counts: the estimate lies within 0.85-1.3x of the measured peak, and auto with that estimate as the budget picks
    the largest mini-batch within it (``make bench-memory ARGS=--gradcache`` prints the larger rows)."""
    from memory_gradcache import auto_choice, measured_loss_peak

    cfg = bench_memory.compose(bench_memory.gradcache_overrides(batch, mini_batch))
    estimated, measured = bench_memory.estimated_peak(cfg), measured_loss_peak(cfg)
    assert 0.85 <= estimated / measured <= 1.3, (estimated / 2**20, measured / 2**20)
    auto = bench_memory.compose(bench_memory.gradcache_overrides(batch, "auto"))
    chosen = auto_choice(auto, estimated)  # this mini-batch, or more where the optimizer step sets the peak
    assert chosen >= mini_batch
    assert bench_memory.estimated_peak(bench_memory.compose(bench_memory.gradcache_overrides(batch, chosen + 1))) \
        > estimated


def test_the_plans_length_chunks_are_the_encoders(make_cfg):
    """model.length_chunks is auto in the schema (4 on the CPU): the plan cuts a forward as the encoder does (it fell
    back to 1 of its own where the key was missing); one block under left padding."""
    from gte_pro.models.length_chunks import chunks_for
    from gte_pro.modes.build import build_encoder
    from gte_pro.preflight.batch_lengths import length_chunks_of

    cfg = make_cfg(["debug=fast"])
    assert length_chunks_of(cfg, False, "right") == chunks_for(build_encoder(cfg).length_chunks, "cpu") == 4
    assert length_chunks_of(make_cfg(["debug=fast", "model.length_chunks=2"]), False, "right") == 2
    assert length_chunks_of(cfg, False, "left") == 1
