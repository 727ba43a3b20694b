"""data=mix: GTE's multi-source sampling (p_i proportional to n_i ** alpha, or weights), one source per global
batch under DDP, determinism and exact resume, per-source validation with the mean as val/ndcg@10, clear errors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gte_pro.data.mix_sampling import MixSampler, offsets_of, source_probabilities
from gte_pro.errors import DataError
from tests.conftest import free_port, write_jsonl
from tests.ddp_harness import spawn_ranks

if TYPE_CHECKING:  # imported where used: the spawned DDP ranks import this file and need only the sampler
    from gte_pro.data.mix import MixDataModule

COUNTS = [400, 100, 25]
# Pearson's chi-square with 2 degrees of freedom (3 sources) has P(X > x) = exp(-x / 2): the critical value at
# significance 1e-4 is 2 ln(1e4) = 18.4. The draws are seeded, so this is a fixed outcome, not a flaky one
CRITICAL = 2 * math.log(1e4)
EXPECTED = {0.0: [1 / 3, 1 / 3, 1 / 3], 0.5: [20 / 35, 10 / 35, 5 / 35], 1.0: [400 / 525, 100 / 525, 25 / 525]}


def chi_square(observed: np.ndarray, probabilities: list[float]) -> float:
    total = observed.sum()
    expected = total * np.asarray(probabilities)
    return float(((observed - expected) ** 2 / expected).sum())


def sources_of(rows: np.ndarray, counts: list[int] = COUNTS) -> np.ndarray:
    return np.searchsorted(offsets_of(counts), rows, side="right") - 1


def epochs_of(sampler: MixSampler, epochs: int) -> list[np.ndarray]:
    return [batch for epoch in range(epochs) for batch in sampler.global_batches(epoch)]


# --- the draw of sources ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("alpha", [0.0, 0.5, 1.0])
def test_each_global_batch_is_one_source_drawn_with_p_proportional_to_n_to_the_alpha(alpha: float):
    probabilities = source_probabilities(COUNTS, None, alpha)
    np.testing.assert_allclose(probabilities, EXPECTED[alpha])
    batches = epochs_of(MixSampler(COUNTS, probabilities, batch_size=8, seed=3), 40)
    assert len(batches) == 40 * (525 // 8)  # an epoch: all rows / global batch
    per_batch = [np.unique(sources_of(batch)) for batch in batches]
    assert all(len(sources) == 1 for sources in per_batch)
    observed = np.bincount([int(s[0]) for s in per_batch], minlength=3)
    assert chi_square(observed, EXPECTED[alpha]) < CRITICAL, observed
    for other in set(EXPECTED) - {alpha}:  # the test can tell the alphas apart
        assert chi_square(observed, EXPECTED[other]) > CRITICAL, (other, observed)


@pytest.mark.parametrize("same_source", [True, False], ids=["same-source", "mixed"])
def test_explicit_weights_set_the_frequencies(same_source: bool):
    probabilities = source_probabilities(COUNTS, [1.0, 2.0, 5.0], alpha=0.5)
    np.testing.assert_allclose(probabilities, [1 / 8, 2 / 8, 5 / 8])
    batches = epochs_of(MixSampler(COUNTS, probabilities, batch_size=8, seed=5, same_source=same_source), 40)
    if same_source:
        observed = np.bincount([int(sources_of(b)[0]) for b in batches], minlength=3)  # one draw per batch
    else:
        observed = np.bincount(np.concatenate([sources_of(b) for b in batches]), minlength=3)  # one draw per row
        assert sum(len(np.unique(sources_of(b))) > 1 for b in batches) > len(batches) / 2  # batches do mix
    assert chi_square(observed, [1 / 8, 2 / 8, 5 / 8]) < CRITICAL, observed
    assert chi_square(observed, EXPECTED[0.5]) > CRITICAL, observed
    assert all(len(np.unique(b)) == len(b) == 8 for b in batches)  # never a row twice in a batch


@pytest.mark.parametrize("lengths", [False, True], ids=["shuffled", "length-grouped"])
def test_a_source_is_drawn_without_replacement_and_cycled_when_oversampled(lengths: bool):
    rng = np.random.default_rng(0)
    source_lengths = [rng.integers(5, 300, n) for n in COUNTS] if lengths else None
    sampler = MixSampler(COUNTS, EXPECTED[0.5], batch_size=8, seed=1, lengths=source_lengths, window_batches=2)
    batches = sampler.global_batches(0)
    by_source = [[b for b in batches if sources_of(b)[0] == s] for s in range(3)]
    big = np.concatenate(by_source[0])
    assert len(big) < COUNTS[0] and len(np.unique(big)) == len(big)  # undersampled: distinct rows
    small = by_source[2]  # 25 rows: 3 batches of 8 per pass, then a new pass
    assert len(small) > 3
    for start in range(0, len(small) - 2, 3):
        one_pass = np.concatenate(small[start : start + 3])
        assert len(np.unique(one_pass)) == 24
    assert not np.array_equal(np.concatenate(small[:3]), np.concatenate(small[3:6]))  # each pass shuffled anew


# --- through the data module -------------------------------------------------------------------------------------
def _write_sources(folder: Path, sizes: tuple[int, int] = (60, 30)) -> dict[str, dict]:
    folder.mkdir(parents=True, exist_ok=True)
    topics = {"cook": "recipe", "sail": "boat"}
    specs = {}
    for (name, word), size in zip(topics.items(), sizes, strict=True):
        rows = [{"query": f"{word} question number {i}?", "positive": f"The {word} answer {i} explained at length.",
                 "negatives": [f"A {word} distractor {i}-{j} with some words." for j in range(3)]} for i in range(size)]
        specs[name] = {"type": "jsonl", "train_file": str(write_jsonl(folder / f"{name}.jsonl", rows))}
    return specs


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return _write_sources(tmp_path_factory.mktemp("mix"))


def _module(sources: dict, tokenizer, world: tuple[int, int] | None = None, **options) -> MixDataModule:
    from gte_pro.modes.build_data import data_module

    options = {"batch_size": 4, "val_fraction": 0.2, "num_negatives": 1, "seed": 7, **options}
    module = data_module("mix", sources=sources, tokenizer=tokenizer, **options)
    module.prepare_data()
    module.setup("fit")
    if world is not None:
        module.trainer = SimpleNamespace(world_size=world[0], global_rank=world[1])
    return module


def _signature(batch: dict) -> tuple:
    return tuple(batch["rows"].tolist()), tuple(batch["doc"]["input_ids"].flatten().tolist())


def _epoch(module: MixDataModule, epoch: int) -> list[tuple]:
    loader = module.train_dataloader()
    loader.sampler.set_epoch(epoch)
    return [_signature(batch) for batch in loader]


def test_setup_keeps_reports_rows_and_one_validation_set_per_source(sources: dict, tokenizer):
    module = _module({**sources, "sail": {**sources["sail"], "num_negatives": 2}}, tokenizer)
    assert [r["mix_source"] for r in module.reports] == ["cook", "sail"]
    assert [r["read"] for r in module.reports] == [60, 30]
    rows = module.source_rows
    assert len(module.train_rows) == rows["cook"] + rows["sail"]
    assert module.probabilities["cook"] == pytest.approx(math.sqrt(rows["cook"]) / sum(map(math.sqrt, rows.values())))
    assert [name for name, _ in module.validation_sets()] == ["cook", "sail"] == module.averaged_sets
    assert all(rs.queries for _, rs in module.validation_sets()) and len(module.val_dataloader()) == 2
    for batch in module.train_dataloader():  # batch["rows"] are global rows: train_rows reads them back
        words = {"recipe" if "recipe" in module.train_rows[r].query else "boat" for r in batch["rows"].tolist()}
        assert len(words) == 1 and batch["num_negatives"] == (2 if words == {"boat"} else 1)  # its own negatives


@pytest.mark.parametrize("same_source", [True, False], ids=["same-source", "mixed"])
def test_order_is_deterministic_and_resumes_mid_epoch(sources: dict, tokenizer, same_source: bool):
    first = _epoch(_module(sources, tokenizer, same_source_batches=same_source), epoch=1)
    assert first == _epoch(_module(sources, tokenizer, same_source_batches=same_source), epoch=1)
    assert first != _epoch(_module(sources, tokenizer, same_source_batches=same_source, seed=8), epoch=1)
    assert first != _epoch(_module(sources, tokenizer, same_source_batches=same_source), epoch=2)

    stopped = _module(sources, tokenizer, same_source_batches=same_source)
    loader = stopped.train_dataloader()
    loader.sampler.set_epoch(1)
    iterator = iter(loader)
    head = [_signature(next(iterator)) for _ in range(5)]
    state = json.loads(json.dumps(stopped.state_dict()))  # it travels in a checkpoint
    assert state["train_position"]["batches_done"] == 5
    resumed = _module(sources, tokenizer, same_source_batches=same_source)
    resumed.load_state_dict(state)
    assert head + [_signature(b) for b in resumed.train_dataloader()] == first

    other = _module(sources, tokenizer, same_source_batches=same_source, alpha=1.0)
    other.load_state_dict(state)  # another mix orders the same rows differently: refused, not guessed
    with pytest.raises(ValueError, match="probabilities"):
        other.train_dataloader()


def _rank_main(rank: int, world: int, port: int, counts: list[int], probabilities: list[float], out: str) -> None:
    """One DDP rank: the mix's sampler, as the rank's training loader uses it, for two epochs."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        np.random.seed(100 + rank)  # no rank may depend on global random state
        torch.manual_seed(100 + rank)
        sampler = MixSampler(counts, probabilities, batch_size=3, world_size=world, rank=rank, seed=7)
        steps = []
        for epoch in range(2):
            sampler.set_epoch(epoch)
            rows = [row for row, _ in sampler]
            steps += [rows[i : i + 3] for i in range(0, len(rows), 3)]
        gathered: list = [None] * world
        dist.all_gather_object(gathered, steps)
        if rank == 0:
            Path(out).write_text(json.dumps(gathered))
    finally:
        dist.destroy_process_group()


def test_same_source_batches_hold_across_two_ddp_ranks(sources: dict, tokenizer, tmp_path: Path):
    module = _module(sources, tokenizer, batch_size=3, group_by_length=False)  # the ranks' sampler has no lengths
    counts, probabilities = list(module.source_rows.values()), list(module.probabilities.values())
    out = tmp_path / "steps.json"
    spawn_ranks(_rank_main, (2, free_port(), counts, probabilities, str(out)), tmp_path)
    rank0, rank1 = json.loads(out.read_text())
    assert len(rank0) == len(rank1) == 2 * (sum(counts) // 6)  # two epochs of global batches of 2 x 3 rows
    chosen = []
    for rows0, rows1 in zip(rank0, rank1, strict=True):
        sources0, sources1 = (set(sources_of(np.array(rows), counts).tolist()) for rows in (rows0, rows1))
        assert len(rows0) == len(rows1) == 3 and sources0 == sources1 and len(sources0) == 1
        assert not set(rows0) & set(rows1)
        chosen += sources0
    assert set(chosen) == {0, 1}  # both sources were drawn
    per_epoch = len(rank0) // 2
    for rank, steps in enumerate((rank0, rank1)):  # the data module's loader on that rank serves these rows
        module.trainer = SimpleNamespace(world_size=2, global_rank=rank)
        assert [batch["rows"].tolist() for batch in module.train_dataloader()] == steps[:per_epoch]


# --- training through compose --------------------------------------------------------------------------------------
def test_fit_logs_each_source_and_their_mean_as_the_monitored_metric(make_cfg, tmp_path: Path):
    from gte_pro.train import train
    from tests.beir_data import write_beir_folder

    # "echo": the positive repeats the query, retrieval is easy; "noise": no word in common, it is not
    echo = [{"query": f"alpha {i} bravo {i * 7} charlie", "positive": f"alpha {i} bravo {i * 7} charlie!"}
            for i in range(60)]
    noise = [{"query": f"question {i} about item {i * 3}", "positive": f"unrelated passage with words {i % 5} here"}
             for i in range(60)]
    files = {name: write_jsonl(tmp_path / f"{name}.jsonl", rows) for name, rows in (("echo", echo), ("noise", noise))}
    beir = write_beir_folder(tmp_path / "beirset")
    spec = ", ".join(f"{name}: {{type: jsonl, train_file: '{path}'}}" for name, path in files.items())
    cfg = make_cfg(["debug=fast", "data=mix", f"data.sources={{{spec}}}", "data.val_fraction=0.25", "logger=none",
                    "callbacks.progress_bar=null", "export.hf=false", f"eval.beir=['{beir}']"])
    value = train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    for when in ("val_before", "val"):
        logged = metrics[when]
        assert {"val/echo/ndcg@10", "val/noise/ndcg@10", "val/beirset/ndcg@10", "val/ndcg@10"} <= set(logged)
        assert logged["val/echo/ndcg@10"] > logged["val/noise/ndcg@10"]
        for metric in ("ndcg@10", "mrr@10", "recall@10"):
            mean = (logged[f"val/echo/{metric}"] + logged[f"val/noise/{metric}"]) / 2  # eval.beir is not part of it
            assert logged[f"val/{metric}"] == pytest.approx(mean, abs=1e-6)
    assert value == pytest.approx(metrics["val"]["val/ndcg@10"])
    assert Path(metrics["best_checkpoint"]).is_file()  # checkpointing found val/ndcg@10
    assert [r["mix_source"] for r in metrics["data"]] == ["echo", "noise"]


# --- errors --------------------------------------------------------------------------------------------------------
JSONL = {"type": "jsonl", "train_file": "a.jsonl"}


@pytest.mark.parametrize(("options", "message"), [
    ({"sources": {}}, r"data\.sources=\{\}: expected at least one source"),
    ({"sources": None}, r"data\.sources=None: expected at least one source"),
    ({"sources": {"qa": {"train_file": "a.jsonl"}}}, r"data\.sources\.qa\.type is required; valid choices: jsonl, hf, "
                                                     r"beir, demo"),
    ({"sources": {"qa": {"type": "csv"}}}, r"data\.sources\.qa\.type='csv' is not a source type; valid choices: "
                                           r"jsonl, hf, beir, demo"),
    ({"sources": {"qa": "a.jsonl"}}, r"data\.sources\.qa='a\.jsonl': expected a mapping"),
    ({"sources": {"q a": JSONL}}, r"data\.sources\.q a: a source name may only hold"),
    ({"sources": {"qa": {"type": "jsonl"}}}, r"data\.sources\.qa\.train_file is required for a jsonl source"),
    ({"sources": {"qa": {**JSONL, "batch_size": 4}}}, r"data\.sources\.qa\.batch_size: shared by all sources of a "
                                                      r"mix; set data\.batch_size"),
    ({"sources": {"qa": {**JSONL, "path": "x"}}}, r"data\.sources\.qa\.path: not a setting of a jsonl source; valid "
                                                  r"keys: type, cache_dir, .*train_file"),
    ({"sources": {"qa": {"type": "hf", "path": "x", "columns": {"answer": "a"}}}},
     r"data\.sources\.qa: data\.columns: unknown role\(s\) answer"),
    ({"weights": {"qa": 1, "web": 2}}, r"data\.weights: unknown web; missing code; give one weight per source: qa, "
                                       r"code"),
    ({"weights": [1.0]}, r"data\.weights=\[1\.0\]: 1 weights for 2 sources \(qa, code\)"),
    ({"weights": {"qa": -1, "code": 1}}, r"data\.weights\.qa=-1: expected a number >= 0"),
    ({"weights": {"qa": 1, "code": "x"}}, r"data\.weights\.code='x': expected a number >= 0"),
    ({"weights": {"qa": 0, "code": 0.0}}, r"data\.weights: all zero"),
    ({"weights": 3}, r"data\.weights=3: expected name -> weight for the sources qa, code"),
    ({"same_source_batches": False, "sources": {"qa": {**JSONL, "num_negatives": 0},
                                                "code": {**JSONL, "num_negatives": 2}}},
     r"num_negatives differ \(qa: 0, code: 2\) but with data\.same_source_batches=false"),
])
def test_bad_mix_settings_name_the_key_and_what_is_valid(options: dict, message: str):
    from gte_pro.modes.build_data import data_module

    options = {"sources": {"qa": JSONL, "code": JSONL}, **options}
    with pytest.raises(DataError, match=message):
        data_module("mix", **options)


def test_bad_sources_at_setup_name_the_source(sources: dict, tokenizer, tmp_path: Path):
    missing = {**sources, "gone": {"type": "jsonl", "train_file": str(tmp_path / "nope.jsonl")}}
    with pytest.raises(DataError, match=r"data\.sources\.gone: .*nope\.jsonl: file not found"):
        _module(missing, tokenizer)
    module = _module(sources, tokenizer, batch_size=4, world=(8, 0))  # 32 rows a step, the sail source has 24
    with pytest.raises(DataError, match=r"data\.sources\.sail: only \d+ training pairs, fewer than one global batch "
                                        r"\(data\.batch_size=4 x 8 devices\)"):
        module.train_dataloader()
    with pytest.raises(DataError, match=r"eval\.beir: the set name\(s\) cook are also data\.sources names"):
        module.add_eval_sets([("cook", module.validation_sets()[0][1])])


def test_config_checks_name_bad_mix_keys(make_cfg):
    from gte_pro.config.checks import config_problems

    assert "data.sources is required: set data.sources=..." in config_problems(make_cfg(["data=mix"]))
    good = ["data=mix", "data.sources={qa: {type: jsonl, train_file: a.jsonl, max_length: 64}}"]
    assert config_problems(make_cfg(good)) == []
    problems = config_problems(make_cfg([*good, "data.alpha=-1", "data.same_source_batches=maybe",
                                         "data.sources.qa.max_length=0"]))
    assert "data.alpha=-1.0: expected a number >= 0" in problems  # a float: the schema types data.alpha
    assert "data.same_source_batches='maybe': valid choices: true, false" in problems
    assert "data.sources.qa.max_length=0: expected an integer >= 1" in problems
    assert any(p.startswith("data.remine: not supported with data=mix") for p in
               config_problems(make_cfg([*good, "data.remine.every_n_epochs=1"])))
