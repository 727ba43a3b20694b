"""Run curves and sweep reports, from the CSV logger's files (written here as Lightning's CSVLogger writes them)."""

from __future__ import annotations

import json
from pathlib import Path

from gte_pro.launch.sweep import summarize_sweep
from gte_pro.utils.plots import parse_overrides, plot_run, plot_sweep, read_curves, swept_keys

HEADER = "epoch,lr-AdamW,step,train/loss,val/ndcg@10,val/scifact/ndcg@10\n"


def _csv_run(folder: Path, ndcg: float, versions: int = 1) -> Path:
    """A run's csv/version_N/metrics.csv: validation at step 0 and 4, loss and lr at steps 1..4."""
    for version in range(versions):
        path = folder / "csv" / f"version_{version}" / "metrics.csv"
        path.parent.mkdir(parents=True)
        rows = [f"0,,0,,{ndcg / 2},0.1"] + [f",{1e-3 * step},{step},{2.0 - step / 4 + version},,"
                                            for step in range(1, 5)] + [f"0,,4,,{ndcg},0.2"]
        path.write_text(HEADER + "\n".join(rows) + "\n")
    return folder


def test_curves_are_read_per_metric_and_a_later_version_replaces_repeated_steps(tmp_path: Path):
    curves = read_curves(_csv_run(tmp_path / "run", 0.5, versions=2))
    assert curves["val/ndcg@10"] == [(0, 0.25), (4, 0.5)]
    assert curves["lr-AdamW"] == [(step, 1e-3 * step) for step in range(1, 5)]
    # version_1 (a resumed start) logged the same steps with other values: its values win
    assert curves["train/loss"] == [(step, 2.0 - step / 4 + 1) for step in range(1, 5)]
    assert "epoch" not in curves and "step" not in curves


def test_a_run_gets_curves_png_and_a_run_without_csv_gets_none(tmp_path: Path):
    path = plot_run(_csv_run(tmp_path / "run", 0.5))
    assert path == tmp_path / "run" / "curves.png" and path.read_bytes()[:4] == b"\x89PNG"
    (tmp_path / "bare").mkdir()
    assert plot_run(tmp_path / "bare") is None


def test_overrides_and_swept_keys():
    assert parse_overrides("model.lr=1e-05 +trainer.foo=a=b devices=2") == {
        "model.lr": "1e-05", "trainer.foo": "a=b", "devices": "2"}
    rows = [{"overrides": "model.lr=1e-05 loss=gte seed=1"}, {"overrides": "model.lr=2e-05 loss=gte seed=1"},
            {"overrides": "model.lr=2e-05 loss=infonce seed=1"}]
    assert swept_keys(rows) == ["model.lr", "loss"]


def test_sweep_report_plots_the_metric_per_key_and_overlays_curves_marking_the_best(tmp_path: Path):
    sweep = tmp_path / "sweep"
    for job, (lr, loss, ndcg) in enumerate([("1e-05", "gte", 0.4), ("1e-04", "gte", 0.7), ("1e-03", "infonce", 0.5)]):
        folder = _csv_run(sweep / str(job), ndcg)
        (folder / ".hydra").mkdir()
        (folder / ".hydra" / "overrides.yaml").write_text(f"- model.lr={lr}\n- loss={loss}\n")
        (folder / "metrics.json").write_text(json.dumps({"val": {"val/ndcg@10": ndcg}, "global_step": 4}))
    (sweep / "3" / ".hydra").mkdir(parents=True)  # a failed job: no metrics, still listed
    (sweep / "3" / ".hydra" / "overrides.yaml").write_text("- model.lr=1.0\n- loss=gte\n")
    (sweep / "3" / "error.txt").write_text("Traceback ...\nValueError: boom\n")
    rows = summarize_sweep(sweep, "val/ndcg@10")
    report = plot_sweep(sweep, rows, "val/ndcg@10").read_text()
    assert "4 jobs, 3 with `val/ndcg@10`" in report and "Best: job 1 (`model.lr=1e-04 loss=gte`)" in report
    assert "ValueError: boom" in report  # the summary table is part of the report
    for image in ("metric_vs_model.lr.png", "metric_vs_loss.png", "curves.png"):
        assert f"]({image})" in report and (sweep / image).read_bytes()[:4] == b"\x89PNG"
