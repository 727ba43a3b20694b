"""A scored file's teacher record (``gte_pro.scoring.teacher_file``) at training time: ``teacher_temperature=auto``
reads the teacher's scores at the temperature of its kind (an explicit number wins), a teacher weaker than the
student or near uniform is refused before any model loads unless ``loss.allow_weak_teacher=true``, and a run that
ends below its val_before says so."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from gte_pro.config.checks import check_config
from gte_pro.errors import ConfigError
from gte_pro.scoring.teacher_file import chosen_temperature, loss_options, record_path, teacher_record, write_record
from tests.conftest import write_jsonl

# positive first: the teacher ranks it first in 1 group of 3, the student in all 3
TEACHER = np.array([[0.50, 0.60, 0.10], [0.90, 0.20, 0.10], [0.30, 0.40, 0.35]])
STUDENT = np.array([[0.80, 0.60, 0.10], [0.90, 0.20, 0.10], [0.70, 0.40, 0.35]])


def _scored_file(tmp_path: Path, kind: str | None, student: bool = False, groups: np.ndarray = TEACHER) -> Path:
    rows = [{"query": f"q{i}", "pos": [f"p{i}"], "neg": [f"n{i}a", f"n{i}b"], "pos_scores": [float(g[0])],
             "neg_scores": [float(g[1]), float(g[2])]} for i, g in enumerate(groups)]
    path = write_jsonl(tmp_path / "scored.jsonl", rows * 4)
    if kind is not None:
        write_record(path, teacher_record("the-teacher", kind, groups,
                                          student=("the-student", STUDENT) if student else None))
    return path


def _cfg(make_cfg, path: Path, *extra: str):
    return make_cfg(["loss=distill_kl", "data=jsonl", f"data.train_file={path}", *extra])


@pytest.mark.parametrize(("kind", "expected"), [("embedder", 0.05), ("cross-encoder", 1.0), (None, 1.0)])
def test_auto_reads_the_teacher_at_the_temperature_of_its_kind(make_cfg, tmp_path: Path, kind, expected, caplog):
    from gte_pro.modes.build import module_config

    path = _scored_file(tmp_path, kind)
    assert chosen_temperature("auto", path)[0] == expected
    with caplog.at_level(logging.INFO, logger="gte_pro.scoring.teacher_file"):
        loss = module_config(_cfg(make_cfg, path))["loss"]
    assert loss["teacher_temperature"] == expected
    why = "sentence-transformers" if kind == "embedder" else "logits"
    assert f"read at {expected} (auto: " in caplog.text and why in caplog.text
    # the number a user sets wins over the record
    assert module_config(_cfg(make_cfg, path, "loss.teacher_temperature=0.3"))["loss"]["teacher_temperature"] == 0.3


def test_an_ensemble_is_read_at_its_recommended_temperature(tmp_path: Path):
    path = _scored_file(tmp_path, "ensemble")
    record = teacher_record("the-teacher", "ensemble", TEACHER)
    assert record["temperature"] == record["recommended_temperature"] is not None
    assert chosen_temperature("auto", path)[0] == record["recommended_temperature"]
    assert loss_options({"teacher_temperature": "auto", "temperature": 0.02}, str(path)) == {
        "teacher_temperature": record["recommended_temperature"], "temperature": 0.02}


def test_a_teacher_below_the_floor_is_refused_with_its_figures_and_the_override(make_cfg, tmp_path: Path):
    """The student ranks all 3 positives first (top1 1.0: the ceiling of a model that mined its rows), so it is not
    the bar; the teacher's 0.333 is below the floor of 0.9."""
    path = _scored_file(tmp_path, "embedder", student=True)
    with pytest.raises(ConfigError) as refused:
        check_config(_cfg(make_cfg, path))
    message = str(refused.value)
    assert "weak teacher (the-teacher, embedder" in message and str(record_path(path)) in message
    assert "ranks the labelled positive first in only 0.333 of the rows' groups (< 0.9" in message
    assert "loss.allow_weak_teacher=true" in message
    # a temperature does not make the teacher rank more positives first: the fix does not offer one
    assert "teacher_temperature" not in message.split("Fix:")[1]
    assert "score with a teacher that ranks the rows' positives first more often" in message
    check_config(_cfg(make_cfg, path, "loss.allow_weak_teacher=true"))  # the override lets it through
    with pytest.raises(ConfigError, match="in only 0.333"):  # margin_mse judges top1 too
        check_config(make_cfg(["loss=margin_mse", "data=jsonl", f"data.train_file={path}"]))


def test_a_student_is_a_bar_only_below_the_ceiling_of_the_rows_it_mined(make_cfg, tmp_path: Path):
    """The case of issue 39: an ensemble teacher at top1 0.994 against the student that mined the rows at 0.9989
    was refused, by construction. Against a student below the ceiling the comparison stands."""
    from gte_pro.scoring.report import judgement_line
    from gte_pro.scoring.teacher_file import weak_teacher_problem

    def record(teacher_top1: float, student_top1: float) -> dict:
        figures = {"groups": 1000, "mean_margin": 0.1, "mean_normalised_entropy": 0.3, "temperature": 0.05}
        return {"teacher": "ensemble", "kind": "ensemble", "student": "the-miner", "recommended_temperature": 0.2,
                "teacher_figures": {**figures, "top1": teacher_top1},
                "student_figures": {**figures, "top1": student_top1}, "entropy_by_temperature": {},
                "temperature": 0.2, "temperature_why": "recommended"}

    assert weak_teacher_problem("f.jsonl", record(0.994, 0.9989), "distill_kl", None) is None
    assert "at the ceiling" in judgement_line(record(0.994, 0.9989))
    refused = weak_teacher_problem("f.jsonl", record(0.95, 0.97), "distill_kl", None)
    assert "less often than the student the-miner" in refused and "teacher_temperature" not in refused
    assert "at the ceiling" not in judgement_line(record(0.95, 0.97))
    assert "in only 0.850" in weak_teacher_problem("f.jsonl", record(0.85, 0.999), "distill_kl", None)
    # the floor is for a student at the ceiling only: a teacher above a comparable student, or judged without one,
    # is not held to it
    assert weak_teacher_problem("f.jsonl", record(0.6, 0.5), "distill_kl", None) is None
    alone = {**record(0.3, 0.5), "student": None, "student_figures": None}
    assert weak_teacher_problem("f.jsonl", alone, "distill_kl", None) is None


def test_a_near_uniform_teacher_is_refused_at_the_temperature_it_is_read_at(make_cfg, tmp_path: Path):
    good = np.array([[0.9, 0.2, 0.1], [0.8, 0.3, 0.1]])
    path = _scored_file(tmp_path, "cross-encoder", groups=good)  # cosine-like scores taken for logits: read at 1
    with pytest.raises(ConfigError, match=r"near uniform at teacher_temperature 1.0 \(mean normalised entropy 0\.9"):
        check_config(_cfg(make_cfg, path))
    with pytest.raises(ConfigError, match=r"set loss.teacher_temperature=0\.\d+ \(recommended\)"):
        check_config(_cfg(make_cfg, path))
    check_config(_cfg(make_cfg, path, "loss.teacher_temperature=0.05"))  # sharp enough at 0.05
    check_config(make_cfg(["loss=margin_mse", "data=jsonl", f"data.train_file={path}"]))  # no softmax to judge
    check_config(_cfg(make_cfg, _scored_file(tmp_path, "embedder", groups=good)))  # the same scores as cosines


def test_a_run_below_its_val_before_says_so(caplog):
    from gte_pro.evaluation.report import below_val_before

    metric = "val/ndcg@10"
    assert below_val_before({metric: 0.5}, {metric: 0.6}, metric, "distill_kl") is None
    assert below_val_before(None, {metric: 0.6}, metric, "distill_kl") is None
    with caplog.at_level(logging.WARNING, logger="gte_pro.evaluation.report"):
        below = below_val_before({metric: 0.8}, {metric: 0.44}, metric, "distill_kl")
    assert below["before"] == 0.8 and below["after"] == 0.44 and below["loss"] == "distill_kl"
    assert "val/ndcg@10 0.4400 after training is below 0.8000 before it" in caplog.text
    assert "teacher record" in below["note"]
    assert "teacher" not in below_val_before({metric: 0.8}, {metric: 0.44}, metric)["note"]


def test_a_run_settles_auto_once_before_anything_is_built(make_cfg, tmp_path: Path, caplog):
    """The first step of every mode (``start_run``) resolves ``auto`` into the config and says so once; the module
    built from that config reads the number, and says nothing more."""
    from gte_pro.modes.build import module_config, start_run

    cfg = _cfg(make_cfg, _scored_file(tmp_path, "embedder"))
    with caplog.at_level(logging.INFO, logger="gte_pro.scoring.teacher_file"):
        _, resolution = start_run(cfg)
        loss = module_config(cfg)["loss"]
    assert cfg.loss.teacher_temperature == resolution.teacher_temperature == loss["teacher_temperature"] == 0.05
    assert caplog.text.count("read at 0.05 (auto: ") == 1
    assert resolution.record()["teacher_temperature_why"].startswith("auto: ")
