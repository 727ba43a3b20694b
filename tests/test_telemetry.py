"""Telemetry while training (``gte_pro.training.telemetry``): each figure on hand-made embeddings and scores with a
known answer, the cadence, and a tiny run that logs telemetry/* to metrics.csv at the due steps and draws them in
curves.png (and a run with the switch off that logs none)."""

from __future__ import annotations

import csv
import math
import struct
from pathlib import Path

import pytest
import torch

from gte_pro.config.defaults import default_loss
from gte_pro.train import train
from gte_pro.training import telemetry as tm
from gte_pro.utils.plots import plot_run
from tests.conftest import write_jsonl

TELEMETRY = ("telemetry/false_negative_rate", "telemetry/alignment", "telemetry/uniformity",
             "telemetry/teacher_agreement", "telemetry/teacher_spearman")


def _circle(n: int) -> torch.Tensor:
    angles = torch.arange(n) * 2 * math.pi / n
    return torch.stack([angles.cos(), angles.sin()], dim=1)


# --- the figures -------------------------------------------------------------------------------------------------
def test_false_negative_rate_counts_candidates_scored_above_the_positive():
    # row 0: one of its 3 other candidates (column 2) above its positive (column 0); row 1: none above column 1
    scores = torch.tensor([[0.5, 0.1, 0.9, 0.5], [0.2, 0.8, 0.3, 0.7]])
    assert tm.false_negative_rate(scores, torch.tensor([0, 1])).item() == pytest.approx(1 / 6)  # a tie is not above
    # a row whose hard negative's embedding sits closer to the query than its positive
    query = torch.tensor([[1.0, 0.0]])
    candidates = torch.tensor([[0.6, 0.8], [0.99, 0.14]])  # [positive; hard negative]
    assert tm.false_negative_rate(query @ candidates.T, torch.tensor([0])).item() == 1.0
    # the same two documents with the roles swapped: the positive is the closer one
    assert tm.false_negative_rate(query @ candidates.T, torch.tensor([1])).item() == 0.0


def test_alignment_is_zero_for_identical_pairs_and_four_for_opposite_ones():
    x = torch.randn(6, 8)
    assert tm.alignment(x, 3 * x).item() == pytest.approx(0.0, abs=1e-6)  # unit vectors: scale does not matter
    assert tm.alignment(x, -x).item() == pytest.approx(4.0)
    orthogonal = torch.tensor([[1.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    assert tm.alignment(*orthogonal).item() == pytest.approx(2.0)


def test_uniformity_is_zero_when_collapsed_and_lower_when_spread_on_the_circle():
    assert tm.uniformity(torch.ones(5, 2)).item() == pytest.approx(0.0, abs=1e-6)
    # two antipodal points: the one pair is 2 apart, log exp(-2 * 4) = -8
    assert tm.uniformity(torch.tensor([[1.0, 0.0], [-1.0, 0.0]])).item() == pytest.approx(-8.0)
    spread, bunched = tm.uniformity(_circle(8)), tm.uniformity(_circle(64)[:8])  # 8 points all round vs in an arc
    assert spread < bunched < 0
    assert tm.pair_uniformity(torch.ones(4, 2), _circle(2)).item() == pytest.approx(-4.0)  # the two sides' mean
    assert math.isnan(tm.uniformity(torch.ones(1, 2)).item())  # one embedding: no pair


def test_teacher_agreement_and_spearman_leave_out_unscored_slots():
    teacher = torch.tensor([[3.0, 2.0, 1.0], [1.0, 2.0, float("nan")], [5.0, float("nan"), float("nan")]])
    same = torch.tensor([[0.9, 0.5, 0.1], [0.1, 0.8, 9.0], [0.0, 1.0, 2.0]])  # row 1's top is a NaN slot: ignored
    assert tm.teacher_agreement(same, teacher).item() == 1.0  # row 2 has one scored slot: not counted
    assert tm.teacher_spearman(same, teacher).item() == pytest.approx(1.0)
    reversed_ = torch.tensor([[0.1, 0.5, 0.9], [0.8, 0.1, 0.0], [0.0, 0.0, 0.0]])
    assert tm.teacher_agreement(reversed_, teacher).item() == 0.0
    assert tm.teacher_spearman(reversed_, teacher).item() == pytest.approx(-1.0)
    half = torch.tensor([[0.9, 0.1, 0.5], [0.8, 0.1, 0.0]])  # row 0: right top, ranks 1 3 2 (rho 0.5); row 1: wrong
    assert tm.teacher_agreement(half, teacher[:2]).item() == 0.5
    assert tm.teacher_spearman(half, teacher[:2]).item() == pytest.approx((0.5 - 1.0) / 2)
    # ties share their mean rank; an all-tied student row has no correlation and is left out
    tied = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert tm.teacher_spearman(tied, teacher[:2]).item() == pytest.approx(math.sqrt(3) / 2)
    assert math.isnan(tm.teacher_spearman(torch.zeros(1, 3), teacher[2:]).item())


def test_own_candidates_follow_the_losses_column_layout():
    # 2 rows, k = 2: columns [pos0, pos1, n0a, n0b, n1a, n1b]
    scores = torch.arange(12.0).reshape(2, 6)
    assert tm.own_candidates(scores, torch.tensor([0, 1]), 2).tolist() == [[0, 2, 3], [7, 10, 11]]
    # under DDP: rank 1 of 2 holds global rows 2 and 3 of [pos0..pos3, n0..n3] (k = 1), its labels offset by 2
    gathered = torch.arange(16.0).reshape(2, 8)
    assert tm.own_candidates(gathered, torch.tensor([2, 3]), 1).tolist() == [[2, 6], [11, 15]]


def test_step_telemetry_reads_the_losses_scores_and_embeddings():
    generator = torch.Generator().manual_seed(0)
    q, p, n = (torch.randn(*shape, generator=generator) for shape in ((4, 8), (4, 8), (4, 2, 8)))
    out = default_loss("infonce")(q, p, n)
    assert torch.equal(out.query, q) and torch.equal(out.positive, p) and not out.query.requires_grad
    teacher = torch.tensor([[1.0, 0.0, -1.0]] * 4)
    figures = tm.step_telemetry(out.scores, out.labels, out.query, out.positive, 2, teacher)
    assert set(figures) == set(TELEMETRY)
    assert figures["telemetry/alignment"] == pytest.approx(tm.alignment(q, p).item())
    fnr = tm.false_negative_rate(out.scores, out.labels).item()
    assert figures["telemetry/false_negative_rate"] == pytest.approx(fnr)
    # a single row has no pair for uniformity: left out rather than NaN; no teacher: no agreement figures
    assert set(tm.step_telemetry(out.scores[:1], out.labels[:1], q[:1], p[:1], 2)) == {
        "telemetry/false_negative_rate", "telemetry/alignment"}


def test_telemetry_is_due_every_n_steps():
    assert [s for s in range(1, 11) if tm.telemetry_due(s, 4)] == [4, 8]
    assert not any(tm.telemetry_due(s, every) for s in range(1, 5) for every in (0, None))


# --- a tiny run --------------------------------------------------------------------------------------------------
def _scored_file(path: Path) -> Path:
    return write_jsonl(path, [{
        "query": f"what is topic number {i}?",
        "pos": [f"Topic {i} is a subject that covers item {i} in depth, with examples."],
        "neg": [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(2)],
        "pos_scores": [0.9], "neg_scores": [0.5 - 0.2 * j for j in range(2)]} for i in range(48)])


def _run(make_cfg, tmp_path: Path, name: str, every: int, steps: int) -> tuple[list[dict[str, str]], Path]:
    out = tmp_path / name
    # distillation data (teacher scores) under GradCache: all five figures, from the cached embeddings
    cfg = make_cfg(["debug=fast", "logger=csv", "loss=distill_kl", "data=jsonl", "data.num_negatives=2",
                    f"data.train_file={_scored_file(tmp_path / 'scored.jsonl')}", "data.val_fraction=0.2",
                    "loss.mini_batch_size=4", f"trainer.limit_train_batches={steps}",
                    f"eval.telemetry_every_n_steps={every}",
                    "eval.before=false", "export.hf=false", "export.model_card=false"], output_dir=out)
    train(cfg)
    with open(out / "csv" / "version_0" / "metrics.csv") as file:
        return list(csv.DictReader(file)), out


def _png_height(path: Path) -> int:
    return struct.unpack(">I", path.read_bytes()[20:24])[0]  # the IHDR chunk: width, then height


def test_a_tiny_run_logs_telemetry_at_the_due_steps_and_draws_it(make_cfg, tmp_path):
    rows, out = _run(make_cfg, tmp_path, "on", every=2, steps=4)
    # steps 2 and 4 (the CSV's step column counts from 0), each once, beside that step's train metrics
    assert sorted(int(row["step"]) for row in rows if row.get("telemetry/false_negative_rate")) == [1, 3]
    assert {int(row["step"]) for row in rows if row.get("train/loss")} == {0, 1, 2, 3}
    for row in rows:
        if row.get("telemetry/false_negative_rate"):
            values = {name: float(row[name]) for name in TELEMETRY}
            assert 0 <= values["telemetry/false_negative_rate"] <= 1 and 0 <= values["telemetry/alignment"] <= 4
            assert values["telemetry/uniformity"] < 0 and 0 <= values["telemetry/teacher_agreement"] <= 1
            assert -1 <= values["telemetry/teacher_spearman"] <= 1
    assert _png_height(out / "curves.png") == 800  # the second row of panels: telemetry

    rows, out = _run(make_cfg, tmp_path, "off", every=0, steps=2)
    assert rows and not any(name.startswith("telemetry/") for name in rows[0])
    assert _png_height(out / "curves.png") == 400


def test_curves_without_telemetry_keep_one_row(tmp_path):
    path = tmp_path / "run" / "csv" / "version_0" / "metrics.csv"
    path.parent.mkdir(parents=True)
    path.write_text("epoch,step,train/loss,telemetry/alignment\n0,0,1.0,\n0,1,0.5,1.2\n")
    assert _png_height(plot_run(tmp_path / "run")) == 800
    path.write_text("epoch,step,train/loss\n0,0,1.0\n0,1,0.5\n")
    assert _png_height(plot_run(tmp_path / "run")) == 400
