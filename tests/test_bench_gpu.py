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
import mfu  # noqa: E402 - bench_gpu.py's MFU and decoder FLOPs, imported by it from the path above


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
    assert mfu.peak_tflops("NVIDIA H200", None) == 989.0
    assert mfu.peak_tflops("Tesla T4", None) is None and mfu.peak_tflops("Tesla T4", 65.0) == 65.0
    assert mfu.with_mfu({"gflops": 98_900.0}, 989.0)["mfu"] == pytest.approx(0.1)


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
    assert rows[0]["non_embedding_params"] == mfu.decoder_flops(bench_gpu.DECODERS["qwen2-tiny"])[0]
    assert "| qwen2-tiny | 32 | 4 | fsdp |" in capsys.readouterr().out


def test_decoder_flops_count_the_qwen2_shapes_and_lora_skips_frozen_weight_gradients():
    params, full = mfu.decoder_flops(bench_gpu.DECODERS["qwen2-0.5b"])
    assert params == 357_898_112 and full == 6 * params  # Qwen2-0.5B: 494M with its 151,936 x 896 embedding
    _, lora = mfu.decoder_flops(bench_gpu.DECODERS["qwen2-0.5b"], bench_gpu.LORA["r"])
    adapters = 24 * 16 * ((896 + 896) + (896 + 128))  # q_proj and v_proj (2 kv heads of 64: 128 outputs) per layer
    assert lora == 4 * params + 6 * adapters
    assert mfu.decoder_flops(bench_gpu.DECODERS["qwen2-1.5b"])[0] == 1_310_340_608


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


# --- .gpu/run.sh's deadline and its whole-run rows (benchmarks/gpu_run_rows.py) -----------------------------------
_rows_spec = importlib.util.spec_from_file_location("gpu_run_rows", REPO / "benchmarks" / "gpu_run_rows.py")
gpu_run_rows = importlib.util.module_from_spec(_rows_spec)
sys.modules["gpu_run_rows"] = gpu_run_rows
_rows_spec.loader.exec_module(gpu_run_rows)
import gpu_run_results  # noqa: E402 - what a run says, and a run's process: the driver's siblings, on the path above
import train_process  # noqa: E402


def test_no_bench_row_starts_that_its_estimate_says_cannot_end_by_the_deadline(tmp_path: Path,
                                                                               capsys: pytest.CaptureFixture,
                                                                               monkeypatch: pytest.MonkeyPatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench_gpu.fits(100.0, 30.0, 130.0) and not bench_gpu.fits(100.5, 30.0, 130.0)
    assert bench_gpu.fits(1e6, 1e6, None)  # no deadline: everything fits
    out = tmp_path / "rows.json"
    # 20 s left, 30 s expected of a row before any has run: nothing starts (no child process), all are listed
    assert bench_gpu.main(["--cpu", "--sizes", "tiny", "--seq", "32", "--batch", "4,8", "--changes", "",
                           "--decoders", "", "--deadline", "20", "--row-seconds", "30", "--json", str(out)]) == 0
    saved = json.loads(out.read_text())
    assert saved["rows"] == [] and [r["batch"] for r in saved["not_run"]] == [4, 8]
    assert "not run (past --budget 420 s or --deadline 20 s): tiny seq 32 batch 8" in capsys.readouterr().out


def _fake_rows(clock: list[float], seconds: dict[str, float], failing: set[str] = frozenset()) -> dict:
    """Runners that take ``seconds[row]`` on the fake ``clock`` and say what they ran."""
    def runner(name: str):
        def run(ctx) -> dict:
            clock[0] += seconds[name]
            if name in failing:
                return {"row": name, "error": "exit code 1", "wall_s": seconds[name], "log_tail": "Traceback"}
            return {"row": name, "wall_s": seconds[name], "run": f"/runs/{name}", "val_before": 0.1, "val": 0.2,
                    "recall10": 0.3, "global_step": 78, "exports_min_cosine": 1.0, "exports": ["hf"],
                    "round_trip_max_abs_diff": 0.0, "cpu_vs_gpu_max_abs_diff": None, "estimated_gib": 1.0,
                    "measured_gib": None, "peak_rss_mb": 900.0, "timing": {"training": 1.0}, "samples_per_s": 50.0}
        return run
    return {name: runner(name) for name in gpu_run_rows.ROWS}


def test_the_whole_rows_estimates_follow_the_measured_whole_run_and_none_starts_past_the_deadline(
        capsys: pytest.CaptureFixture):
    clock, saved = [0.0], []
    ctx = gpu_run_rows.Context([], Path("/runs"), 4, {}, 0.0)
    # the whole row's prior is 120 s; it really takes 40 s: resume is then expected at 2.6 x 40 = 104 s, ddp 49 s,
    # fsdp 54 s, compile 130 s
    plan = gpu_run_rows.Plan(deadline=250.0, whole_prior=120.0)
    seconds = {"whole": 40.0, "resume": 100.0, "ddp": 45.0, "fsdp": 50.0, "compile": 60.0}
    done = gpu_run_rows.run_rows(list(gpu_run_rows.ROWS), plan, ctx, 0.0, lambda rows, skipped: saved.append(
        [r["row"] for r in rows]), _fake_rows(clock, seconds), clock=lambda: clock[0])
    # at 185 s fsdp's 54 s would end at 239 <= 250: it runs; at 235 s compile's 130 s cannot: listed, not started
    assert [r["row"] for r in done] == ["whole", "resume", "ddp", "fsdp"] and plan.whole_s == 40.0
    assert plan.not_run == [{"row": "compile", "elapsed_s": 235.0, "expected_s": 130.0, "deadline_s": 250.0}]
    assert saved[-1] == ["whole", "resume", "ddp", "fsdp"] and len(saved) == 4  # saved as each row ends
    printed = capsys.readouterr().out
    assert "compile: not run: 130 s expected, 235 s gone of 250" in printed
    assert printed.count(": ok in ") == 4


def test_a_failed_whole_row_keeps_the_prior_and_prints_its_log():
    clock = [0.0]
    plan = gpu_run_rows.Plan(deadline=200.0, whole_prior=120.0)
    ctx = gpu_run_rows.Context([], Path("/runs"), 4, {}, 0.0)
    done = gpu_run_rows.run_rows(["whole", "resume"], plan, ctx, 0.0, lambda rows, skipped: None,
                                 _fake_rows(clock, {"whole": 10.0}, failing={"whole"}), clock=lambda: clock[0])
    assert [r["row"] for r in done] == ["whole"] and plan.whole_s is None
    assert plan.not_run[0]["row"] == "resume" and plan.not_run[0]["expected_s"] == 312.0  # 2.6 x the 120 s prior
    assert gpu_run_results.row_line(done[0]) == "whole: FAILED after 10 s: exit code 1"


def test_a_run_is_read_from_its_metrics_json_and_its_log(tmp_path: Path):
    # the keys a finished train.py run writes (metrics.json of a debug=fast run, trimmed)
    (tmp_path / "metrics.json").write_text(json.dumps({
        "val_before": {"val/ndcg@10": 0.0225}, "val": {"val/ndcg@10": 0.4612, "val/recall@10": 0.6579},
        "train": {"train/samples_per_s": 131.8}, "global_step": 78, "restarts": [],
        "memory": {"weights": 0.08, "estimated_peak": 2.0}, "peak_rss_mb": {"setup": 680.0, "training": 809.5},
        "exports": {"verify_texts": 7, "min_cosine": {"sentence_transformers": 0.99999994, "hf": 0.9999999},
                    "state_dict_round_trip_max_abs_diff": 0.0, "cpu_vs_gpu_max_abs_diff": None},
        "timing": {"training": 12.5, "total": 30.0}}))
    summary = gpu_run_results.summarise(tmp_path)
    assert summary["exports_min_cosine"] == 0.9999999 and summary["exports"] == ["hf", "sentence_transformers"]
    assert summary["peak_rss_mb"] == 809.5 and summary["measured_gib"] is None and summary["estimated_gib"] == 2.0
    line = gpu_run_results.row_line({"row": "whole", "wall_s": 33.0, **summary})
    assert line.startswith("whole: ok in 33 s (training 12.5 s, 132 samples/s, 78 steps); val/ndcg@10 0.0225 -> "
                           "0.4612 (recall@10 0.6579); exports hf+sentence_transformers min cosine 0.9999999")
    assert "CPU vs GPU - (no GPU); memory estimated 2.000 GiB (no CUDA" in line
    on_gpu = gpu_run_results.memory_text({"estimated_gib": 2.0, "measured_gib": 1.5})
    assert on_gpu == "memory estimated 2.000 GiB, max_memory_allocated 1.500 GiB, 0.75x the estimate"
    log = "step 4/10 | loss 3.1 | 40.0 samples/s\nEpoch 0 ...\nstep 7/10 | loss 3.0 | 41.0 samples/s\n"
    assert train_process.last_step(log) == 7 and train_process.total_steps(log) == 10
    assert train_process.last_step("Validation 15/15") == 0


def test_weights_compare_bit_for_bit_across_both_exports(tmp_path: Path):
    import torch
    from safetensors.torch import save_file

    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.ones(4)}
    for name, change in (("ref", 0.0), ("same", 0.0), ("moved", 1e-3)):
        for folder in ("model", "hf"):
            (tmp_path / name / folder).mkdir(parents=True)
            save_file({**tensors, "b": tensors["b"] + change}, str(tmp_path / name / folder / "model.safetensors"))
    same = gpu_run_results.compare(tmp_path / "same", tmp_path / "ref")
    assert same == {"identical": True, "max_abs_diff": 0.0, "tensors": 4}
    moved = gpu_run_results.compare(tmp_path / "moved", tmp_path / "ref")
    assert not moved["identical"] and moved["max_abs_diff"] == pytest.approx(1e-3, rel=1e-3)
    (tmp_path / "ref" / "hf" / "model.safetensors").unlink()
    assert gpu_run_results.compare(tmp_path / "same", tmp_path / "ref")["note"] == "different tensors"


@pytest.mark.parametrize("cpu", [True, False])
def test_the_whole_run_command_composes_as_the_default_run_with_random_weights(cpu: bool, tmp_path: Path):
    from bench_memory import compose

    base = gpu_run_rows.base_overrides("tiny" if cpu else "minilm", cpu, tmp_path, str(tmp_path / "tok"))
    cfg = compose([*base, *gpu_run_rows.ROW_EXTRA["resume"], "callbacks.last_checkpoint.every_n_steps=4"])
    assert cfg.model.lr == 5e-5 and cfg.data.batch_size == 32 and cfg.trainer.max_epochs == 1  # the default recipe
    assert cfg.model.random_init_config.hidden_size == (64 if cpu else 384)
    assert cfg.model.name_or_path == str(tmp_path / "tok") and cfg.trainer.deterministic is True
    assert cfg.trainer.precision == ("32-true" if cpu else "bf16-mixed")
    assert cfg.trainer.accelerator == ("cpu" if cpu else "gpu")
    assert cfg.callbacks.throughput.print_every_n_steps == 1 and cfg.callbacks.last_checkpoint.every_n_steps == 4
    with pytest.raises(SystemExit):
        gpu_run_rows.parse_args(["--rows", "whole,fsdp2"])
