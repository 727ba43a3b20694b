"""benchmarks/harness (real child processes: results, crashes, kills, time-outs, medians, peak memory, the table) and
benchmarks/bench_train.py with its train_common.py (variant specs, the composed config, its table and footnotes). No
training runs."""

from __future__ import annotations

import argparse
import importlib.util
import json
import signal
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, write_jsonl

sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark scripts import their siblings and harness/
_spec = importlib.util.spec_from_file_location("bench_train", REPO / "benchmarks" / "bench_train.py")
bench = importlib.util.module_from_spec(_spec)
sys.modules["bench_train"] = bench
_spec.loader.exec_module(bench)
harness = bench.harness
common = sys.modules["train_common"]  # variant specs and the composed config (child side)

# measurements for real child processes: a result (after touching memory), a crash, the OOM killer's SIGKILL, a hang
TARGETS = '''
import os, signal, subprocess, time
import harness

def ok(payload):
    ballast = b"x" * (payload["mb"] * 2**20)  # written, hence resident (bytes(n) would map untouched zero pages)
    return {"samples_per_s": payload["value"], "peak_gpu_mb": None, **harness.peak_memory(), "n": len(ballast)}

def boom(payload):
    raise ValueError("data.batch_size=1: too small")

def killed(payload):
    os.kill(os.getpid(), signal.SIGKILL)

def hang(payload):
    grandchild = subprocess.Popen(["sleep", "60"])
    open(payload["pid_file"], "w").write(str(grandchild.pid))
    time.sleep(60)
'''


def _opts(tmp_path: Path, **extra) -> argparse.Namespace:
    opts = {"batch_size": 8, "max_length": 64, "steps": 3, "seed": 7, "precision": "32-true", "threads": 1,
            "pairs": None, "pairs_file": None, "eval_queries": None, "work_dir": str(tmp_path)}
    return argparse.Namespace(**{**opts, **extra})


def _targets(tmp_path: Path):
    path = tmp_path / "targets.py"
    path.write_text(textwrap.dedent(TARGETS))
    spec = importlib.util.spec_from_file_location("targets", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _gone(pid: int, within_s: float = 5.0) -> bool:
    """The process has exited (a zombie waiting for its new parent counts as exited)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        status = Path(f"/proc/{pid}/status")
        if not status.exists() or "\nState:\tZ" in status.read_text():
            return True
        time.sleep(0.05)
    return False


def test_variant_specs():
    variants = common.parse_variants("ours, plain,ours:model.attn_implementation=eager:optimizer.fused=true,ours")
    assert [v.spec for v in variants] == ["ours", "plain", "ours:model.attn_implementation=eager:optimizer.fused=true"]
    assert variants[2].kind == "ours"
    assert variants[2].overrides == ("model.attn_implementation=eager", "optimizer.fused=true")
    for bad in ("nope", "st:data.batch_size=4", "ours:eager", ""):
        with pytest.raises(SystemExit):
            common.parse_variants(bad)


def test_failure_reasons():
    assert harness.failure_reason(-signal.SIGKILL, "") == "killed by signal 9 SIGKILL (out of memory?)"
    stderr = "Traceback (most recent call last):\n  File 'x.py'\nValueError: data.batch_size=1: too small\n"
    assert harness.failure_reason(1, stderr) == "exit code 1: ValueError: data.batch_size=1: too small"
    assert harness.failure_reason(2, "") == "exit code 2: no output"


def test_composed_config_is_the_product_config_without_validation(tmp_path):
    cfg = common.compose_cfg(_opts(tmp_path), ["model.attn_implementation=eager"])
    assert cfg.data.batch_size == 8 and cfg.data.max_length == 64 and cfg.model.max_length == 64
    assert cfg.trainer.max_steps == 3 + common.WARMUP_STEPS and cfg.seed == 7
    assert cfg.trainer.limit_val_batches == 0 and cfg.trainer.num_sanity_val_steps == 0
    assert not cfg.trainer.enable_checkpointing and not cfg.logger and not cfg.callbacks
    assert cfg.model.attn_implementation == "eager" and cfg.trainer.precision == "32-true"
    assert cfg.data._target_.endswith("DemoRows")


def test_pairs_file_selects_jsonl_data(tmp_path):
    pairs = write_jsonl(tmp_path / "p.jsonl", [{"query": f"q{i}", "positive": f"p{i}"} for i in range(4)])
    cfg = common.compose_cfg(_opts(tmp_path, pairs_file=str(pairs), precision="bf16-mixed"))
    assert cfg.data._target_.endswith("JsonlRows") and cfg.data.train_file == str(pairs)
    assert cfg.trainer.precision == "bf16-mixed"


def test_children_fail_alone_in_interleaved_rounds(tmp_path):
    """Each measurement in its own process: a crash, a SIGKILL and a hang (killed at the timeout with what it
    started) are recorded with their reasons while the others go on; medians skip the failures."""
    targets, order = _targets(tmp_path), []
    payloads = {"ok": lambda r: {"value": [3.0, 1.0][r], "mb": 64}, "boom": lambda r: {},
                "killed": lambda r: {}, "hang": lambda r: {"pid_file": str(tmp_path / f"pid{r}")}}

    def measure(name: str, round_no: int) -> dict:
        order.append(name)
        if name == "in-process" and round_no == 1:
            raise RuntimeError("lost")
        if name == "in-process":
            return {"samples_per_s": 5.0}
        timeout = 3 if name == "hang" else 60
        return harness.run_child(getattr(targets, name), payloads[name](round_no), tmp_path, timeout)

    started = time.monotonic()
    runs = harness.interleave(["ok", "boom", "killed", "in-process", "hang"], 2, measure)
    assert time.monotonic() - started < 30
    assert order == ["ok", "boom", "killed", "in-process", "hang"] * 2
    assert [r["samples_per_s"] for r in runs["ok"]] == [3.0, 1.0]
    assert all(r["peak_rss_mb"] >= 64 and r["n"] == 64 * 2**20 for r in runs["ok"])
    assert runs["boom"][0]["error"] == "exit code 1: ValueError: data.batch_size=1: too small"
    assert runs["killed"][1]["error"] == "killed by signal 9 SIGKILL (out of memory?)"
    assert runs["in-process"][1] == {"error": "RuntimeError: lost"}
    assert runs["hang"][0]["error"] == "timed out after 3 s"
    assert all(_gone(int((tmp_path / f"pid{r}").read_text())) for r in range(2))  # the grandchildren too
    assert harness.medians(runs["ok"] + runs["boom"], ["samples_per_s", "peak_gpu_mb"]) == {"samples_per_s": 2.0}
    assert harness.medians(runs["in-process"], ["samples_per_s"]) == {"samples_per_s": 5.0}
    assert harness.medians(runs["boom"], ["samples_per_s"]) is None
    assert harness.failure_notes(runs) == ["in-process: 1/2 rounds failed (RuntimeError: lost); medians over the "
                                           "others"]
    assert list(tmp_path.glob("tmp*")) == []  # result files and logs of the children are removed


def _result(samples: float, first: str = "abc", ndcg: float | None = None) -> dict:
    result = {"samples_per_s": samples, "real_tokens_per_s": 10 * samples, "padding_fraction": 0.5, "gflops": 1.0,
              "peak_rss_mb": 100.0, "peak_gpu_mb": None, "first_batch": first, "device": "cpu"}
    return {**result, "score": {"ndcg@10": ndcg, "recall@10": 2 * ndcg}} if ndcg is not None else result


def test_table_shows_failures_and_ratios(capsys, tmp_path):
    variants = common.parse_variants("ours,plain,st,seed,ours:data.batch_size=1")
    runs = {"ours": [_result(2.0, ndcg=0.1), _result(4.0, ndcg=0.3)],
            "plain": [_result(4.0), {"error": "killed by signal 9"}], "st": [_result(2.0)], "seed": [_result(1.0)],
            "ours:data.batch_size=1": [{"error": "exit code 1: ValueError: too small"}]}
    lines = bench.table(runs, eval_on=False).splitlines()
    assert lines[0] == "| variant | samples/s | vs st | vs plain | real tokens/s | padding | GFLOP/s | peak RSS MB |"
    assert lines[1] == "|---" + "|---:" * 7 + "|"
    assert lines[2] == "| ours | 3.00 | 1.50x | 0.75x | 30 | 0.50 | 1.0 | 100 |"
    assert lines[6] == "| ours:data.batch_size=1 | failed: exit code 1: ValueError: too small" + " | -" * 6 + " |"
    scored = bench.table(runs, eval_on=True).splitlines()
    assert scored[0].endswith("| ndcg@10 | recall@10 |")
    assert scored[2].endswith("| 0.2000 | 0.4000 |") and scored[3].endswith("| - | - |")
    assert scored[5].endswith("| n/a | n/a |")  # the seed recipe is never scored
    notes = bench.footnotes(runs, variants)
    assert any("plain: 1/2 rounds failed" in n for n in notes)
    assert any(n.startswith("same batches") for n in notes)
    runs["plain"][0]["first_batch"] = "other"
    assert any("start from different batches" in n for n in bench.footnotes(runs, variants))
    args = argparse.Namespace(batch_size=8, max_length=64, steps=3, rounds=2, precision="32-true", threads=1,
                              pairs_file=None, eval=False, json=str(tmp_path / "r.json"))
    bench.report(args, "python bench", variants, runs, None)
    assert "| ours:data.batch_size=1 | failed:" in capsys.readouterr().out
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["runs"]["st"][0]["samples_per_s"] == 2.0 and saved["medians"]["ours"]["ndcg@10"] == 0.2
