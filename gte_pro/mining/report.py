"""What ``mode=mine`` writes (rank 0, each file atomically): the mined training file, ``mine_report.json`` +
``mine_report.md`` and ``mine_scores.png`` (positive vs mined-negative scores). With a teacher
(``mine.rescore_with``, ``gte_pro.mining.rescore``) every row carries its teacher scores (``pos_scores``,
``neg_scores``), the scores reported and plotted are the teacher's, and the report says what it dropped."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gte_pro.mining.core import MinedNegatives
from gte_pro.mining.problem import MiningProblem
from gte_pro.mining.rescore import Rescored
from gte_pro.scoring.report import judgement_line, judgement_markdown
from gte_pro.scoring.teacher_file import record_path, teacher_record, write_record
from gte_pro.utils.files import write_atomic, write_json_atomic, write_text_atomic
from gte_pro.utils.plots import score_histograms
from gte_pro.utils.tables import markdown_table


def mined_rows(problem: MiningProblem, mined: MinedNegatives, rescored: Rescored | None = None
               ) -> list[dict[str, Any]]:
    """One row per training row in the project's layout, its own negatives replaced by the mined ones; then the
    hash-split validation rows as they were (see ``MiningProblem.held_out``). With ``rescored``, each row's teacher
    scores too (the held-out rows' of their own texts): FlagEmbedding's ``pos_scores`` and ``neg_scores``."""
    negatives = [[problem.corpus[i] for i in row if i >= 0] for row in mined.indices.tolist()]
    rows = [{"query": problem.queries[query], "positive": [problem.corpus[i] for i in positives],
             "negatives": negatives[query]} for query, positives in problem.rows]
    held = [{"query": ex.query, "positive": ex.positives, "negatives": ex.negatives} for ex in problem.held_out]
    if rescored is not None:
        neg_scores = [[s for s in row if s == s] for row in mined.scores.tolist()]  # nan pads left out
        for row, (query, positives) in zip(rows, problem.rows, strict=True):
            of = dict(zip(problem.positives[query], rescored.positive_scores[query], strict=True))
            row["pos_scores"], row["neg_scores"] = [of[i] for i in positives], neg_scores[query]
        for row, (pos_scores, row_neg_scores) in zip(held, rescored.held_out_scores, strict=True):
            row["pos_scores"], row["neg_scores"] = pos_scores, row_neg_scores
    return rows + held


def judge_rescored(output: Path, rescored: Rescored, student: str) -> dict[str, Any]:
    """The teacher record of the mined file (``gte_pro.scoring.teacher_file``), written beside it: the teacher
    judged on each query's window (its positive, then every candidate the embedder proposed) next to the embedder
    that mined it (``student``) and each ensemble member; the temperature recommended for the rows as written."""
    record = teacher_record(rescored.teacher, rescored.kind, rescored.teacher_groups, rescored.file_groups,
                            student=(student, rescored.student_groups), members=rescored.member_groups,
                            judged_on="each query's mining window: its positive, then every candidate the "
                                      "embedder proposed (before the teacher's drops)")
    write_record(output, record)
    return record


def write_mined(path: Path, rows: list[dict[str, Any]]) -> Path:
    def fill(tmp: Path) -> None:
        with tmp.open("w", encoding="utf-8") as handle:
            for row in rows:
                handle.write(json.dumps(row, ensure_ascii=False) + "\n")

    return write_atomic(path, fill)


def _per_query(values: torch.Tensor) -> dict[str, float]:
    """mean and quantiles of a count per query (numpy: torch.quantile refuses more than 2^24 values)."""
    counts = values.cpu().double().numpy()
    if counts.size == 0:
        return {"mean": 0.0, "min": 0.0, "median": 0.0, "p90": 0.0, "max": 0.0}
    low, median, p90, high = (float(v) for v in np.quantile(counts, [0.0, 0.5, 0.9, 1.0]))
    return {"mean": round(float(counts.mean()), 3), "min": low, "median": median, "p90": round(p90, 3), "max": high}


def rescore_summary(rescored: Rescored) -> dict[str, Any]:
    """What the teacher did: pairs scored, seconds, candidates judged and dropped (in all and per query)."""
    judged = int(rescored.judged_per_query.sum())
    dropped = int(rescored.dropped_per_query.sum())
    rate = rescored.pairs / max(rescored.seconds, 1e-9)
    return {"teacher": rescored.teacher, "kind": rescored.kind, "pairs_scored": rescored.pairs,
            "seconds": round(rescored.seconds, 3), "pairs_per_s": round(rate, 1),
            "candidates_judged": judged, "dropped": dropped, "dropped_share": round(dropped / max(judged, 1), 4),
            "dropped_per_query": _per_query(rescored.dropped_per_query)}


def _quantiles(values: torch.Tensor) -> dict[str, float | None]:
    values = values[~torch.isnan(values)].float()
    if values.numel() == 0:
        return {"count": 0, "mean": None, "min": None, "median": None, "max": None}
    return {"count": int(values.numel()), "mean": round(float(values.mean()), 4), "min": round(float(values.min()), 4),
            "median": round(float(values.median()), 4), "max": round(float(values.max()), 4)}


def mine_summary(problem: MiningProblem, mined: MinedNegatives, rows: list[dict[str, Any]],
                 details: dict[str, Any], rescored: Rescored | None = None) -> dict[str, Any]:
    """The numbers of the report: rows, negatives per row, short rows, dropped candidates, scores, timing."""
    counts = [len(row["negatives"]) for row in rows[: len(problem.rows)]]
    wanted = int(mined.indices.shape[1])
    candidates = mined.window_candidates
    if candidates < 0:  # not counted: the nominal window (every query's [range_min, range_max) full)
        candidates = len(problem.queries) * (details["options"]["range_max"] - details["options"]["range_min"])
    return {
        "mode": "mine",
        "rows": len(problem.rows),
        "held_out_rows_copied": len(problem.held_out),
        "queries": len(problem.queries),
        "corpus_size": len(problem.corpus),
        "corpus": dict(problem.counts),
        "num_negatives": wanted,
        "negatives_per_row": {"mean": round(sum(counts) / max(len(counts), 1), 3), "min": min(counts, default=0)},
        "rows_short_of_num_negatives": sum(n < wanted for n in counts),
        "dropped_false_negatives": mined.dropped_false_negatives,
        # of the candidates the windows held, not of queries x (range_max - range_min): a small corpus fills less
        "window_candidates": candidates,
        "dropped_share_of_window": round(mined.dropped_false_negatives / max(candidates, 1), 4),
        "scores": "cosine" if rescored is None else f"teacher ({rescored.kind})",
        "positive_scores": _quantiles(mined.positive_scores),
        "negative_scores": _quantiles(mined.scores.flatten()),
        **details,
        "rescore": None if rescored is None else rescore_summary(rescored),
    }


def summary_markdown(summary: dict[str, Any], files: dict[str, Path]) -> str:
    per_row = summary["negatives_per_row"]
    lines = [["rows (queries)", f"{summary['rows']} ({summary['queries']})"],
             ["validation rows copied unchanged", f"{summary['held_out_rows_copied']}"],
             ["corpus size", f"{summary['corpus_size']}"],
             ["negatives per row: mean / min", f"{per_row['mean']} / {per_row['min']} (of {summary['num_negatives']})"],
             ["rows short of num_negatives", f"{summary['rows_short_of_num_negatives']}"],
             ["candidates dropped as likely false negatives", f"{summary['dropped_false_negatives']} "
              f"({100 * summary['dropped_share_of_window']:.1f}% of the {summary['window_candidates']} in the "
              "window)"],
             ["positive / negative score (median)", f"{summary['positive_scores']['median']} / "
              f"{summary['negative_scores']['median']}"],
             ["seconds (texts/s)", f"{summary['seconds']} ({summary['texts_per_s']})"]]
    if rescore := summary.get("rescore"):
        per_query = rescore["dropped_per_query"]
        lines[5] = ["candidates dropped by the teacher (at or above the positive, or by a margin)",
                    f"{rescore['dropped']} ({100 * rescore['dropped_share']:.1f}% of the "
                    f"{rescore['candidates_judged']} it judged)"]
        lines += [["teacher", f"`{rescore['teacher']}` ({rescore['kind']})"],
                  ["dropped per query: mean / median / p90 / max", f"{per_query['mean']} / {per_query['median']} / "
                   f"{per_query['p90']} / {per_query['max']}"],
                  ["rescoring seconds (pairs/s)", f"{rescore['seconds']} ({rescore['pairs_per_s']}, "
                   f"{rescore['pairs_scored']} pairs)"]]
    where = "\n".join(f"- {name}: `{path}`" for name, path in files.items())
    where += f"\n\ntrain on it: `{train_command(files['mined'], summary)}`"
    judgement = judgement_markdown((summary.get("rescore") or {}).get("judgement"))
    return (f"# Hard-negative mining\n\nmodel `{summary['model']}`, {summary['world_size']} process(es), options "
            f"`{json.dumps(summary['options'])}`\n\n" + markdown_table(["", "value"], lines) + judgement
            + f"\n{where}\n")


def plot_scores(path: Path, mined: MinedNegatives, teacher_kind: str | None = None) -> Path:
    """Histogram of the queries' positive scores and the mined negatives' scores (matplotlib, headless): cosine
    scores, or with ``teacher_kind`` the teacher's (a cross-encoder's logits have no upper bound)."""
    positive = mined.positive_scores[~torch.isnan(mined.positive_scores)].cpu().numpy()
    negative = mined.scores[~torch.isnan(mined.scores)].cpu().numpy()
    values = [v for v in (positive, negative) if len(v)]
    low = min((float(v.min()) for v in values), default=-1.0)
    high = 1.0 if teacher_kind is None else max((float(v.max()) for v in values), default=1.0)
    bins = [low + (high - low) * i / 50 for i in range(51)] if low < high else 50
    return score_histograms(path, [(negative, "mined negatives"), (positive, "positives")],
                            "cosine score to the query" if teacher_kind is None else
                            f"the teacher's score ({teacher_kind})", bins)


def train_command(output: Path, summary: dict[str, Any]) -> str:
    """The command that trains on the mined file; with copied validation rows, the split that holds them out; the
    mining run's own model and debug overrides (``carried_overrides``)."""
    command = f"python train.py data=jsonl data.train_file={output} data.num_negatives={summary['num_negatives']}"
    if summary["held_out_rows_copied"]:
        command += f" data.val_fraction={summary['val_fraction']}"
    if summary.get("rescore"):  # the rows carry the teacher's pos_scores/neg_scores: distill from them
        command += " loss=distill_kl"
    return " ".join([command, *map(shlex.quote, summary.get("carried_overrides") or [])])


CARRIED = ("model", "debug")


def carried_overrides(overrides: list[str]) -> list[str]:
    """The overrides of a mining run that its training run needs as they were: the model (``model=``,
    ``model.*=``, ``+model.*=``) and ``debug=``; not the data's or mine's, which the mined file replaces."""
    def key(override: str) -> str:
        return override.lstrip("+~").split("=", 1)[0]

    return [o for o in overrides if key(o) in CARRIED or key(o).startswith(tuple(f"{g}." for g in CARRIED))]


def nothing_kept(problem: MiningProblem, mined: MinedNegatives, options: dict[str, Any], teacher: bool
                 ) -> tuple[str, str] | None:
    """(what, how to fix it) when no row got a single negative: the file would train on in-batch negatives only,
    which the mining was meant to improve on; None when any row has one."""
    if not problem.rows or bool((mined.indices >= 0).any()):
        return None
    window = f"[{options['range_min']}, {options['range_max']})"
    margins = ", ".join(f"mine.{name}={options[name]}" for name in ("relative_margin", "absolute_margin",
                                                                     "max_score") if options[name] is not None)
    if mined.window_candidates == 0:
        what = (f"mode=mine kept no negative for any of the {len(problem.rows)} rows: the rank window {window} held "
                f"no candidate (a corpus of {len(problem.corpus)} documents)")
        return what, ("start the window lower (mine.range_min=0) or give more documents to mine from "
                      "(mine.corpus_files=...)")
    by = "the teacher (mine.rescore_with)" + (f" and {margins}" if margins else "") if teacher else (
        margins or "the margins")
    what = (f"mode=mine kept no negative for any of the {len(problem.rows)} rows: {by} dropped all "
            f"{mined.dropped_false_negatives} candidates of the rank window {window}")
    wider = (f"a wider window (mine.range_max > {options['range_max']})" if len(problem.corpus) > options["range_max"]
             else "more documents to mine from (mine.corpus_files=...)")
    return what, f"lower {margins or 'the margin'} (null turns a margin off), or give {wider}, so that some survive"


def write_mine_outputs(output: Path, run_dir: Path, problem: MiningProblem, mined: MinedNegatives,
                       details: dict[str, Any], rescored: Rescored | None = None) -> dict[str, Any]:
    """Write the mined file, the report (json + md) and the plot; print where they are; return the summary."""
    rows = mined_rows(problem, mined, rescored)
    write_mined(output, rows)
    summary = mine_summary(problem, mined, rows, details, rescored)
    files = {"mined": output, "report": run_dir / "mine_report.json", "table": run_dir / "mine_report.md",
             "plot": run_dir / "mine_scores.png"}
    if rescored is not None:
        summary["rescore"]["judgement"] = judge_rescored(output, rescored, str(details.get("model")))
        files["teacher record"] = record_path(output)
    summary["files"] = {name: str(path) for name, path in files.items()}
    write_json_atomic(files["report"], summary)
    write_text_atomic(files["table"], summary_markdown(summary, files))
    plot_scores(files["plot"], mined, None if rescored is None else rescored.kind)
    print("\n".join(f"{name + ':':8} {path}" for name, path in files.items()))
    if rescored is not None:
        print(judgement_line(summary["rescore"]["judgement"], output))
    print(f"train on it: {train_command(output, summary)}")
    return summary
