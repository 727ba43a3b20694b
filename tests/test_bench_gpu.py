"""benchmarks/bench_gpu.py (make bench-gpu): without CUDA it says so and exits 0; its whole code path (the grid,
the one-at-a-time changes, each row in a child process training through the product path) runs on the CPU with a
tiny encoder and a tiny decoder (full, LoRA, gradient checkpointing, FSDP); the decoders' FLOP count."""

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
                           "--decoders", "", "--steps", "2", "--precision", "32-true", "--threads", "1",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["change"]) for r in rows] == [(4, None), (8, None), (8, "gradcache"), (8, "ddp")]
    for row in rows:
        assert "error" not in row, row
        assert row["samples_per_s"] > 0 and row["measured_steps"] == 2 and 0 <= row["padding_fraction"] < 1
        assert row["estimated_mb"] > 0  # the estimate every run prints, beside the measured peak
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
                           "--decoders", "", "--steps", "2", "--precision", "32-true", "--threads", "1",
                           "--budget", "0", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert [r["batch"] for r in saved["rows"]] == [4] and [r["batch"] for r in saved["not_run"]] == [8]
    printed = capsys.readouterr().out
    assert "tiny seq 32 batch 4: " in printed and "samples/s" in printed
    assert "not run (past --budget 0 s): tiny seq 32 batch 8" in printed


def test_mfu_uses_the_device_peak():
    assert bench_gpu.peak_tflops("NVIDIA H200", None) == 989.0
    assert bench_gpu.peak_tflops("Tesla T4", None) is None and bench_gpu.peak_tflops("Tesla T4", 65.0) == 65.0
    assert bench_gpu.with_mfu({"gflops": 98_900.0}, 989.0)["mfu"] == pytest.approx(0.1)


@pytest.mark.slow  # four fresh training processes, FSDP's among them: ~35-55 s on 2 CPU cores
def test_the_decoder_rows_run_on_the_cpu_with_a_tiny_qwen2(tmp_path: Path, capsys: pytest.CaptureFixture,
                                                          monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "rows.json"
    assert bench_gpu.main(["--cpu", "--sizes", "", "--decoders", "qwen2-tiny", "--decoder-seq", "32",
                           "--decoder-batch", "4", "--steps", "2", "--precision", "32-true", "--threads", "1",
                           "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["family"], r["size"], r["change"]) for r in rows] == [
        ("decoder", "qwen2-tiny", None), ("decoder", "qwen2-tiny", "lora"),
        ("decoder", "qwen2-tiny", "checkpointing"), ("decoder", "qwen2-tiny", "fsdp")]
    for row in rows:
        assert "error" not in row, row
        assert row["samples_per_s"] > 0 and row["measured_steps"] == 2 and row["gflops"] > 0
        assert row["estimated_mb"] > 0
    # the same batches whatever the change; the FLOP count leaves the 4,096-row embedding matrix out
    assert len({row["first_batch"] for row in rows}) == 1
    assert rows[0]["non_embedding_params"] == bench_gpu.decoder_flops("qwen2-tiny", None)[0]
    assert "| qwen2-tiny | 32 | 4 | fsdp |" in capsys.readouterr().out


def test_decoder_flops_count_the_qwen2_shapes_and_lora_skips_frozen_weight_gradients():
    params, full = bench_gpu.decoder_flops("qwen2-0.5b", None)
    assert params == 357_898_112 and full == 6 * params  # Qwen2-0.5B: 494M with its 151,936 x 896 embedding
    _, lora = bench_gpu.decoder_flops("qwen2-0.5b", "lora")
    adapters = 24 * 16 * ((896 + 896) + (896 + 128))  # q_proj and v_proj (2 kv heads of 64: 128 outputs) per layer
    assert lora == 4 * params + 6 * adapters
    assert bench_gpu.decoder_flops("qwen2-1.5b", None)[0] == 1_310_340_608


def test_decoder_rows_are_a_grid_then_changes_on_the_largest_at_the_last_batch():
    args = bench_gpu.parse_args(["--sizes", "", "--decoders", "qwen2-0.5b,qwen2-1.5b", "--decoder-batch", "8,32",
                                 "--decoder-changes", "lora,fsdp"])
    assert [(r["size"], r["batch"], r["change"]) for r in bench_gpu.rows(args)] == [
        ("qwen2-0.5b", 8, None), ("qwen2-0.5b", 32, None), ("qwen2-1.5b", 8, None), ("qwen2-1.5b", 32, None),
        ("qwen2-1.5b", 32, "lora"), ("qwen2-1.5b", 32, "fsdp")]
    overrides = bench_gpu.decoder_overrides("qwen2-1.5b", 256, 32, "lora")
    assert "++model.random_init_config.vocab_size=151936" in overrides and "++model.lora.r=16" in overrides
    with pytest.raises(SystemExit):
        bench_gpu.parse_args(["--decoder-changes", "qlora"])
