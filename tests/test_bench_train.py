"""benchmarks/bench_train.py: variant specs, failure reporting, the composed config, the table. No training runs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, write_jsonl

_spec = importlib.util.spec_from_file_location("bench_train", REPO / "benchmarks" / "bench_train.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_train"] = bench
_spec.loader.exec_module(bench)


def _opts(tmp_path: Path, **extra) -> argparse.Namespace:
    opts = {"batch_size": 8, "max_length": 64, "steps": 3, "seed": 7, "precision": "32-true", "threads": 1,
            "pairs": None, "pairs_file": None, "eval_queries": None, "work_dir": str(tmp_path)}
    return argparse.Namespace(**{**opts, **extra})


def test_variant_specs():
    variants = bench.parse_variants("ours, plain,ours:model.attn_implementation=eager:optimizer.fused=true,ours")
    assert [v.spec for v in variants] == ["ours", "plain", "ours:model.attn_implementation=eager:optimizer.fused=true"]
    assert variants[2].kind == "ours"
    assert variants[2].overrides == ("model.attn_implementation=eager", "optimizer.fused=true")
    for bad in ("nope", "st:data.batch_size=4", "ours:eager", ""):
        with pytest.raises(SystemExit):
            bench.parse_variants(bad)


def test_failure_reasons():
    assert bench.failure_reason(-signal.SIGKILL, "") == "killed by signal 9 SIGKILL (out of memory?)"
    stderr = "Traceback (most recent call last):\n  File 'x.py'\nValueError: data.batch_size=1: too small\n"
    assert bench.failure_reason(1, stderr) == "exit code 1: ValueError: data.batch_size=1: too small"
    assert bench.failure_reason(2, "") == "exit code 2: no output"


def test_composed_config_is_the_product_config_without_validation(tmp_path):
    cfg = bench.compose_cfg(_opts(tmp_path), ["model.attn_implementation=eager"])
    assert cfg.data.batch_size == 8 and cfg.data.max_length == 64 and cfg.model.max_length == 64
    assert cfg.trainer.max_steps == 3 + bench.WARMUP_STEPS and cfg.seed == 7
    assert cfg.trainer.limit_val_batches == 0 and cfg.trainer.num_sanity_val_steps == 0
    assert not cfg.trainer.enable_checkpointing and not cfg.logger and not cfg.callbacks
    assert cfg.model.attn_implementation == "eager" and cfg.trainer.precision == "32-true"
    assert cfg.data._target_.endswith("DemoDataModule")


def test_pairs_file_selects_jsonl_data(tmp_path):
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"query": f"q{i}", "positive": f"p{i}"} for i in range(4)])
    cfg = bench.compose_cfg(_opts(tmp_path, pairs_file=str(pairs), precision="bf16-mixed"))
    assert cfg.data._target_.endswith("JsonlDataModule") and cfg.data.train_file == str(pairs)
    assert cfg.trainer.precision == "bf16-mixed"


def test_a_hung_child_is_killed_at_the_timeout(tmp_path):
    opts = {**vars(_opts(tmp_path)), "task": "train", "spec": "plain", "save_dir": None}
    result = bench.run_child(opts, timeout=0.5, work=tmp_path)
    assert result["error"].startswith("timed out after")


def _result(samples: float, first: str = "abc") -> dict:
    return {"samples_per_s": samples, "real_tokens_per_s": 10 * samples, "padding_fraction": 0.5, "gflops": 1.0,
            "peak_rss_mb": 100.0, "peak_gpu_mb": None, "first_batch": first, "device": "cpu"}


def test_table_shows_failures_and_ratios(capsys, tmp_path):
    variants = bench.parse_variants("ours,plain,st,ours:data.batch_size=1")
    runs = {"ours": [_result(2.0), _result(4.0)], "plain": [_result(4.0), {"error": "killed by signal 9"}],
            "st": [_result(2.0)], "ours:data.batch_size=1": [{"error": "exit code 1: ValueError: too small"}]}
    lines = bench.table(runs, eval_on=False)
    assert lines[2].startswith("| ours | 3.00 | 1.50x | 0.75x |")
    assert "failed: exit code 1: ValueError: too small" in lines[5]
    notes = bench.footnotes(runs, variants)
    assert any("plain: 1/2 rounds failed" in n for n in notes)
    assert any(n.startswith("same batches") for n in notes)
    runs["plain"][0]["first_batch"] = "other"
    assert any("start from different batches" in n for n in bench.footnotes(runs, variants))
    args = argparse.Namespace(batch_size=8, max_length=64, steps=3, rounds=2, precision="32-true", threads=1,
                              pairs_file=None, eval=False, json=str(tmp_path / "r.json"))
    bench.report(args, "python bench", variants, runs, None)
    assert "| ours:data.batch_size=1 | failed:" in capsys.readouterr().out
    assert json.loads((tmp_path / "r.json").read_text())["runs"]["st"][0]["samples_per_s"] == 2.0
