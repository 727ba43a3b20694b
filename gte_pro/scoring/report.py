"""What ``mode=score`` writes besides the scored file (rank 0, each atomically): ``score_report.json`` +
``score_report.md`` (rows, pairs, shards scored and reused, seconds, the teacher, score quantiles, likely false
negatives) and ``score_hist.png`` (positive vs negative scores), then prints where they are and the command that
trains on the scored file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from gte_pro.scoring.core import quantiles
from gte_pro.scoring.teacher_file import comparison_note, weak_teacher_problem
from gte_pro.utils.files import write_json_atomic, write_text_atomic
from gte_pro.utils.plots import score_histograms
from gte_pro.utils.tables import markdown_table


def scores(markers: list[dict[str, Any]], key: str) -> np.ndarray:
    """One array of every shard's ``key`` scores (pos_scores or neg_scores)."""
    return np.concatenate([np.asarray(marker[key], dtype=np.float32) for marker in markers] or [np.zeros(0)])


def score_summary(markers: list[dict[str, Any]], details: dict[str, Any]) -> dict[str, Any]:
    """The report's numbers from the shards' markers (every shard, scored now or before) and the run's details."""
    positives, negatives = scores(markers, "pos_scores"), scores(markers, "neg_scores")
    suspects = sum(marker["likely_false_negatives"] for marker in markers)
    return {
        "mode": "score",
        "rows": sum(marker["rows"] for marker in markers),
        "pairs": len(positives) + len(negatives),
        "positives": len(positives),
        "negatives": len(negatives),
        "shards": len(markers),
        "positive_scores": quantiles(positives),
        "negative_scores": quantiles(negatives),
        # a negative the teacher scores at least as high as its row's best positive: likely an unlabelled positive
        "likely_false_negatives": suspects,
        "likely_false_negative_share": round(suspects / max(len(negatives), 1), 4),
        **details,
    }


def summary_markdown(summary: dict[str, Any], files: dict[str, Path]) -> str:
    pos, neg = summary["positive_scores"], summary["negative_scores"]
    lines = [["rows", summary["rows"]],
             ["pairs (positives / negatives)", f"{summary['pairs']} ({summary['positives']} / {summary['negatives']})"],
             ["shards: scored now / reused", f"{summary['shards_scored']} / {summary['shards_reused']} "
              f"(of {summary['shards']}, {summary['shard_rows']} rows each)"],
             ["seconds (pairs/s)", f"{summary['seconds']} ({summary['pairs_per_s']})"],
             ["positive score: p05 / median / p95", f"{pos['p05']} / {pos['median']} / {pos['p95']}"],
             ["negative score: p05 / median / p95", f"{neg['p05']} / {neg['median']} / {neg['p95']}"],
             ["negatives scoring >= their row's best positive (likely false negatives)",
              f"{summary['likely_false_negatives']} ({100 * summary['likely_false_negative_share']:.1f}%)"]]
    where = "\n".join(f"- {name}: `{path}`" for name, path in files.items())
    where += f"\n\ntrain on it: `{train_command(files['scored'])}`"
    return (f"# Teacher scores\n\nteacher `{summary['teacher']}` ({summary['kind']}), {summary['world_size']} "
            f"process(es), max_length {summary['max_length']}, batch_size {summary['batch_size']}\n\n"
            + markdown_table(["", "value"], lines) + judgement_markdown(summary.get("judgement")) + f"\n{where}\n")


def judgement_line(record: dict[str, Any], scored: Path | None = None) -> str:
    """One line: the teacher's figures (and the student's), the temperature used and the one recommended; and,
    when distillation from ``scored`` would refuse this teacher at that temperature, why."""
    def figures(f: dict[str, Any]) -> str:
        return (f"top1 {f['top1']}, mean margin {f['mean_margin']}, mean normalised entropy "
                f"{f['mean_normalised_entropy']} at {f['temperature']}")

    line = f"teacher on the rows' own labels: {figures(record['teacher_figures'])}"
    if record.get("student_figures"):
        line += f"; student {record['student']}: {figures(record['student_figures'])}"
    line += (f"; read at temperature {record['temperature']} ({record['temperature_why']}); recommended "
             f"{record['recommended_temperature']}")
    if note := comparison_note(record):
        line += f"; {note}"
    problem = weak_teacher_problem(scored, record, "distill_kl", record["temperature"]) if scored else None
    return line if problem is None else f"{line}\nWARNING: {problem}"


def judgement_markdown(record: dict[str, Any] | None) -> str:
    """The teacher judged on the rows' own labels, next to the student and each ensemble member (a teacher record
    of ``gte_pro.scoring.teacher_file``); "" without one."""
    if not record:
        return ""
    scorers = [(f"teacher `{record['teacher']}`", record["teacher_figures"])]
    scorers += [(f"member `{member['teacher']}` ({member['kind']}, z-scores)", member["figures"])
                for member in record.get("members", [])]
    if record.get("student_figures"):
        scorers.append((f"student `{record['student']}`", record["student_figures"]))
    rows = [[name, figures["groups"], figures["top1"], figures["mean_margin"], figures["mean_entropy"],
             figures["mean_normalised_entropy"], figures["temperature"]] for name, figures in scorers]
    table = markdown_table(["judged on the rows' own labels", "groups", "top1 (positive above every candidate)",
                            "mean margin (positive - best negative)", "mean entropy (nats)",
                            "mean entropy / log(candidates)", "temperature"], rows)
    return (f"\n## The teacher judged before it teaches\n\n{table}\n"
            f"- temperature its scores are read at (loss.teacher_temperature=auto): {record['temperature']}: "
            f"{record['temperature_why']}\n- recommended temperature: {record['recommended_temperature']}: "
            f"{record['recommended_why']}\n" + (f"- {note}\n" if (note := comparison_note(record)) else ""))


def plot_histograms(path: Path, positives: np.ndarray, negatives: np.ndarray, kind: str) -> Path:
    """Histograms of the positives' and the negatives' teacher scores on shared bins (matplotlib, headless)."""
    return score_histograms(path, [(negatives, "negatives"), (positives, "positives")],
                            "teacher score (logit)" if kind == "cross-encoder" else "teacher score (cosine)")


def train_command(output: Path) -> str:
    return f"python train.py loss=distill_kl data=jsonl data.train_file={output}"


def write_score_outputs(output: Path, run_dir: Path, markers: list[dict[str, Any]],
                        details: dict[str, Any]) -> dict[str, Any]:
    """Write the report (json + md) and the histograms of the scored file ``output`` (already written); print
    where they are and the next command; return the summary."""
    summary = score_summary(markers, details)
    files = {"scored": output, "report": run_dir / "score_report.json", "table": run_dir / "score_report.md",
             "plot": run_dir / "score_hist.png"}
    summary["files"] = {name: str(path) for name, path in files.items()}
    write_json_atomic(files["report"], summary)
    write_text_atomic(files["table"], summary_markdown(summary, files))
    plot_histograms(files["plot"], scores(markers, "pos_scores"), scores(markers, "neg_scores"), summary["kind"])
    print("\n".join(f"{name + ':':8} {path}" for name, path in files.items()))
    if record := summary.get("judgement"):
        print(judgement_line(record, output))
    print(f"train on it: {train_command(output)}")
    return summary
