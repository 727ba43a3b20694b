"""The teacher record of a scored file, ``<scored file>.teacher.json``: which teacher scored it, the temperature its
scores are read at, and how it did on the rows' own labels next to the student (``gte_pro.scoring.judge``).

``mode=score`` and ``mode=mine mine.rescore_with=`` write it beside their output (rank 0, atomically). A training
run with a distillation loss reads it before any model loads:

- ``loss.teacher_temperature=auto`` (the default) reads the teacher's scores at the temperature of its kind
  (``KIND_TEMPERATURE``): an embedder's cosines at 0.05, the temperature the sentence-transformers family was trained
  with (MultipleNegativesRankingLoss, scale 20), a cross-encoder's logits at 1 (trained as logits, FlagEmbedding's
  default); an ensemble's averaged z-scores have no trained temperature and are read at the file's recommended one
  (mean normalised entropy 0.5). A file without a record (scored elsewhere) is read at 1. A number set by the user
  always wins;
- a teacher that ranks the labelled positive first less often than the student (``score.student``), or whose
  softmax is near uniform at the temperature used (``loss=distill_kl``), is refused unless
  ``loss.allow_weak_teacher=true`` (``weak_teacher_problem``). The student is a bar only where the comparison
  means something: the model that mined the rows kept only negatives it scores below its own positive, so on those
  rows its top1 is ~1 by construction; a student at that ceiling is not compared, and the teacher is held to an
  absolute floor of top1 instead (``comparable_student``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from gte_pro.scoring.judge import (
    NEAR_UNIFORM,
    TARGET_ENTROPY,
    entropy_at,
    entropy_curve,
    groups_from_rows,
    judge,
    recommended_temperature,
)
from gte_pro.utils.files import write_json_atomic

log = logging.getLogger(__name__)

# the teacher-student comparison (weak_teacher_problem): a student whose top1 is at least STUDENT_CEILING is not a
# bar (comparable_student); the teacher must then rank the positive first in at least TEACHER_FLOOR of the groups
STUDENT_CEILING = 0.99
TEACHER_FLOOR = 0.9

# the temperature a teacher's scores are read at by kind (module doc); the student (an embedder) is judged at 0.05
KIND_TEMPERATURE = {"embedder": 0.05, "cross-encoder": 1.0}
KIND_WHY = {"embedder": "an embedder's cosines, read at the temperature the sentence-transformers family was "
                        "trained with (MultipleNegativesRankingLoss scale 20 = 0.05)",
            "cross-encoder": "a cross-encoder's logits, read as trained (temperature 1)"}
NO_RECORD_TEMPERATURE = 1.0  # FlagEmbedding's: its files carry raw reranker logits


def record_path(scored: str | Path) -> Path:
    scored = Path(scored).expanduser()
    return scored.with_name(scored.name + ".teacher.json")


def kind_temperature(kind: str, recommended: float | None) -> tuple[float, str]:
    """The temperature a teacher of ``kind`` is read at, and why (module doc)."""
    if kind in KIND_TEMPERATURE:
        return KIND_TEMPERATURE[kind], KIND_WHY[kind]
    if recommended is not None:
        return recommended, (f"an ensemble's averaged z-scores: no trained temperature, read at the one that gives a "
                             f"mean normalised entropy of {TARGET_ENTROPY} on this file")
    return 1.0, "an ensemble's averaged z-scores (unit scale); no temperature reaches the target entropy on this file"


def file_groups(path: str | Path) -> np.ndarray:
    """The judge's groups (``gte_pro.scoring.judge``) of a scored JSON-lines file's pos_scores / neg_scores."""
    from gte_pro.data.records import iter_jsonl

    rows = ((row.get("pos_scores") or [], row.get("neg_scores") or [])
            for _, row in iter_jsonl(str(path)) if isinstance(row, dict))
    return groups_from_rows(rows)


def file_shapes(path: str | Path) -> list[tuple[int, int]]:
    """Each row's (positives, negatives) scored, in file order: how a job's flat pair scores split into rows."""
    from gte_pro.data.records import iter_jsonl

    return [(len(row.get("pos_scores") or []), len(row.get("neg_scores") or []))
            for _, row in iter_jsonl(str(path)) if isinstance(row, dict)]


def flat_groups(flat: np.ndarray, shapes: Iterable[tuple[int, int]]) -> np.ndarray:
    """The judge's groups of pair scores in file order (each row's positives, then its negatives)."""
    rows, at = [], 0
    for positives, negatives in shapes:
        rows.append((flat[at : at + positives], flat[at + positives : at + positives + negatives]))
        at += positives + negatives
    if at != len(flat):
        raise ValueError(f"{len(flat)} pair scores for rows that hold {at} pairs")
    return groups_from_rows(rows)


def teacher_record(teacher: str, kind: str, groups: np.ndarray, file_groups: np.ndarray | None = None,
                   student: tuple[str, np.ndarray] | None = None,
                   members: Iterable[tuple[str, str, np.ndarray]] = (), judged_on: str = "the scored rows"
                   ) -> dict[str, Any]:
    """The record of a scored file: the teacher's figures on ``groups`` (each row's positive, then its
    candidates) at the temperature of its kind, the student's (``(name, groups)``, same candidates, at 0.05) and
    each ensemble member's (``(name, kind, standardised groups)``); the recommended temperature and the entropy
    curve come from ``file_groups`` (the candidates the file holds, default ``groups``)."""
    trained = groups if file_groups is None else file_groups
    recommended = recommended_temperature(trained)
    temperature, why = kind_temperature(kind, recommended)
    return {
        "teacher": teacher, "kind": kind, "judged_on": judged_on,
        "temperature": temperature, "temperature_why": why,
        "recommended_temperature": recommended,
        "recommended_why": (f"the temperature at which the teacher's softmax over each row's candidates has a mean "
                            f"normalised entropy of {TARGET_ENTROPY} (0: the label alone, 1: uniform, no signal)"),
        "teacher_figures": judge(groups, temperature),
        "student": None if student is None else student[0],
        "student_figures": None if student is None else judge(student[1], KIND_TEMPERATURE["embedder"]),
        "members": [{"teacher": name, "kind": member_kind, "figures": judge(member, temperature)}
                    for name, member_kind, member in members],
        "entropy_by_temperature": entropy_curve(trained),
    }


def write_record(scored: str | Path, record: dict[str, Any]) -> Path:
    path = record_path(scored)
    write_json_atomic(path, {"scored_file": str(scored), **record})
    return path


def read_record(scored: str | Path) -> dict[str, Any] | None:
    """The record beside ``scored``, or None (no record, or one that does not read as JSON)."""
    path = record_path(scored)
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        log.warning("%s: not read (not JSON); the teacher of %s is not judged", path, scored)
        return None
    return record if isinstance(record, dict) else None


def chosen_temperature(setting: Any, scored: str | Path | None) -> tuple[float, str]:
    """``loss.teacher_temperature`` as a number, and why: a number set wins; ``auto`` reads the record of the
    training file ``scored`` (None: a source without one file)."""
    if setting != "auto":
        return float(setting), "set by loss.teacher_temperature"
    record = read_record(scored) if scored else None
    if record is None or not isinstance(record.get("temperature"), int | float):
        where = f"no teacher record beside {scored}" if scored else "the training rows have no teacher record"
        return NO_RECORD_TEMPERATURE, (f"auto: {where} (scored outside mode=score / mine.rescore_with), read as "
                                       "logits at 1; set loss.teacher_temperature=0.05 for an embedder's cosines")
    return float(record["temperature"]), f"auto: {record.get('temperature_why')} ({record_path(scored)})"


def _figures(figures: dict[str, Any] | None) -> str:
    if not figures or figures.get("top1") is None:
        return "no figures"
    return (f"top1 {figures['top1']:.3f}, mean margin {figures['mean_margin']}, mean normalised entropy "
            f"{figures['mean_normalised_entropy']} at temperature {figures['temperature']}")


def comparable_student(student: dict[str, Any]) -> bool:
    """Whether the student's top1 on the rows can be held against the teacher. A student at the ceiling
    (``STUDENT_CEILING``) is, in practice, the model that mined the rows: mining kept only the negatives it scored
    below its own positive (``mine.relative_margin``), so on those rows it ranks the positive first by construction
    and any teacher that errs once loses. Then the teacher is held to ``TEACHER_FLOOR`` instead."""
    return student.get("top1") is not None and student["top1"] < STUDENT_CEILING


def weak_teacher_problem(scored: str | Path, record: dict[str, Any], loss: str,
                         temperature: float | None) -> str | None:
    """Why the teacher of ``scored`` should not teach (``record``: its teacher record), or None: it ranks the
    labelled positive first less often than a student it can be compared with (``comparable_student``), or, judged
    next to a student at the ceiling, in fewer than ``TEACHER_FLOOR`` of the groups, or (``loss=distill_kl``,
    ``temperature`` the one used) its softmax is near uniform. The fix names, for each reason, the change that
    clears that reason: a teacher temperature cannot make a teacher rank more positives first, so it is offered for
    the entropy only."""
    teacher, student = record.get("teacher_figures") or {}, record.get("student_figures") or {}
    reasons, fixes = [], []
    top1 = teacher.get("top1")
    if top1 is not None and comparable_student(student) and top1 < student["top1"]:
        reasons.append(f"it ranks the labelled positive first less often than the student {record.get('student')} "
                       f"(teacher {_figures(teacher)}; student {_figures(student)})")
    elif top1 is not None and student.get("top1") is not None and not comparable_student(student) \
            and top1 < TEACHER_FLOOR:
        reasons.append(f"it ranks the labelled positive first in only {top1:.3f} of the rows' groups (< "
                       f"{TEACHER_FLOOR}; {_figures(teacher)})")
    if reasons:
        fixes.append("score with a teacher that ranks the rows' positives first more often (a reranker trained "
                     "longer, or an ensemble of better members)")
    entropy = entropy_at(record.get("entropy_by_temperature") or {}, temperature) if temperature else None
    if loss == "distill_kl" and entropy is not None and entropy > NEAR_UNIFORM:
        reasons.append(f"its softmax over each row's candidates is near uniform at teacher_temperature {temperature}"
                       f" (mean normalised entropy {entropy} > {NEAR_UNIFORM}; 1 is uniform): a student fitted to it "
                       f"learns not to separate positives from negatives")
        recommended = record.get("recommended_temperature")
        fixes.append(f"set loss.teacher_temperature={recommended} (recommended)" if recommended else
                     "set a lower loss.teacher_temperature")
    if not reasons:
        return None
    fixes.append("train with loss=infonce, or set loss.allow_weak_teacher=true to distil from it anyway")
    return (f"data.train_file={scored}: loss={loss} would distil from a weak teacher ({record.get('teacher')}, "
            f"{record.get('kind')}; {record_path(scored)}): " + "; ".join(reasons) + ". Fix: " + "; ".join(fixes))


def comparison_note(record: dict[str, Any]) -> str | None:
    """Why the student's figures were not held against the teacher, for the score report; None when they were."""
    student = record.get("student_figures") or {}
    if not student or comparable_student(student):
        return None
    return (f"the student's top1 {student['top1']} is at the ceiling (>= {STUDENT_CEILING}): on rows it mined itself "
            f"it ranks the positive first by construction (it kept only negatives below its own positive), so the "
            f"teacher is held to top1 >= {TEACHER_FLOOR} instead of the student's")


def loss_options(loss: dict[str, Any], train_file: str | None) -> dict[str, Any]:
    """The ``loss`` config part as the loss is built from it: ``teacher_temperature`` as a number (``auto``
    resolved from the record of ``train_file``, :func:`settled_temperature`)."""
    options = dict(loss)
    if "teacher_temperature" in options:
        options["teacher_temperature"] = settled_temperature(options["teacher_temperature"], train_file)[0]
    return options


def settled_temperature(setting: Any, train_file: str | None) -> tuple[float, str]:
    """``chosen_temperature``; ``auto`` also says in one log line what it came to and why (a run settles it once,
    before anything is built: gte_pro.config.resolve)."""
    temperature, why = chosen_temperature(setting, train_file)
    if setting == "auto":
        log.info("loss.teacher_temperature: the teacher's scores are read at %s (%s)", temperature, why)
    return temperature, why
