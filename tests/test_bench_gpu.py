"""benchmarks/bench_gpu.py (make bench-gpu): without CUDA it says so and exits 0; its whole code path (the grid,
the one-at-a-time changes, each row in a child process training through the product path) runs on the CPU with a
tiny model."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "benchmarks"))  # the benchmark scripts import their siblings
_spec = importlib.util.spec_from_file_location("bench_gpu", REPO / "benchmarks" / "bench_gpu.py")
bench_gpu = importlib.util.module_from_spec(_spec)
sys.modules["bench_gpu"] = bench_gpu
_spec.loader.exec_module(bench_gpu)


def test_without_cuda_it_says_so_and_exits_cleanly(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.main([]) == 0
    assert "no CUDA device here" in capsys.readouterr().out


def test_the_rows_run_on_the_cpu_with_a_tiny_model(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "rows.json"
    assert bench_gpu.main(["--cpu", "--sizes", "tiny", "--seq", "32", "--batch", "4,8", "--changes", "gradcache,ddp",
                           "--steps", "2", "--precision", "32-true", "--threads", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["change"]) for r in rows] == [(4, None), (8, None), (8, "gradcache"), (8, "ddp")]
    for row in rows:
        assert "error" not in row, row
        assert row["samples_per_s"] > 0 and row["measured_steps"] == 2 and 0 <= row["padding_fraction"] < 1
        assert "mfu" not in row  # no peak FLOP/s is known for a CPU: the MFU column stays empty
    # the changed rows train the very batches of their reference row (GradCache in chunks of 4)
    assert rows[2]["first_batch"] == rows[3]["first_batch"] == rows[1]["first_batch"] != rows[0]["first_batch"]
    table = capsys.readouterr().out
    assert "| tiny | 32 | 8 | ddp |" in table and "CPU (" in table


def test_no_row_starts_past_the_budget_and_the_rest_are_listed(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                               monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "rows.json"
    assert bench_gpu.main(["--cpu", "--sizes", "tiny", "--seq", "32", "--batch", "4,8", "--changes", "",
                           "--steps", "2", "--precision", "32-true", "--threads", "1", "--budget", "0",
                           "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [r["batch"] for r in saved["rows"]] == [4] and [r["batch"] for r in saved["not_run"]] == [8]
    printed = capsys.readouterr().out
    assert "tiny seq 32 batch 4: " in printed and "samples/s" in printed
    assert "not run (past --budget 0 s): tiny seq 32 batch 8" in printed


def test_mfu_uses_the_device_peak():
    assert bench_gpu.peak_tflops("NVIDIA H200", None) == 989.0
    assert bench_gpu.peak_tflops("Tesla T4", None) is None and bench_gpu.peak_tflops("Tesla T4", 65.0) == 65.0
    assert bench_gpu.with_mfu({"gflops": 98_900.0}, 989.0)["mfu"] == pytest.approx(0.1)
