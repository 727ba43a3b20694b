"""bench_quality.py's ``soup`` row: a greedy soup (Wortsman et al. 2022) of the mined-7 runs of the benchmark's
seeds, made by ``train.py mode=merge merge.method=greedy`` (``quality_runs.soup_command``: greedy selects on the
held-out split, never on the test set), then scored on the test set per query like every other variant's model.
One run per set, after its members; its table row counts the members in the seeds column."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import quality_runs as q
from harness import Result
from pydocs_runs import keep, recorded_run

VARIANT = "soup"


def finished_members(a: argparse.Namespace, rows: list[Result]) -> list[int]:
    """The seeds (of ``--seeds``, in order) whose mined-7 run finished and left its exported model."""
    done = {r["seed"] for r in rows if r["variant"] == q.REFERENCE and r.get("ndcg") is not None}
    return [s for s in a.seed_list if s in done and (q.run_dir(q.REFERENCE, s, a) / "model" / "config.json").is_file()]


def read_soup(folder: Path) -> Result:
    """What the merge's metrics.json says: the soup's held-out val/ndcg@10 and greedy's steps by member seed."""
    summary = json.loads((folder / "metrics.json").read_text())
    metric = summary["metric"]
    steps = [{"seed": int(Path(step["member"]).parent.name.removeprefix("seed")), "val": step[metric],
              "soup": step["soup"], "kept": step["kept"]} for step in summary.get("greedy_steps") or []]
    return {"val_metric": metric, "val_ndcg": summary["val"][metric], "greedy": steps,
            "kept": sorted(step["seed"] for step in steps if step["kept"])}


def run_soup(a: argparse.Namespace, data: Path, rows: list[Result]) -> Result:
    """The set's soup (kept by ``--reuse`` when its command is unchanged), with its test set's per-query scores;
    an error naming why when fewer than two members finished."""
    seeds = finished_members(a, rows)
    row = {"variant": VARIANT, "seed": ",".join(map(str, seeds)), "members": seeds}
    if len(seeds) < 2:
        return {**row, "error": f"a soup needs at least 2 finished members (the mined-7 runs of --seeds {a.seeds}); "
                                f"finished: {', '.join(map(str, seeds)) or 'none'}"}
    command, folder = q.soup_command(a, seeds), q.soup_dir(a)
    record = folder.with_suffix(".json")
    got = recorded_run(command, record, a, clear=folder,
                       finish=lambda result: {**row, **result, **({} if "error" in result else read_soup(folder))})
    if got is None:
        return {**row, "not_run": True}
    if "error" in got or got.get("per_query") or a.report:
        return got
    # the test set's NDCG@10: only from this evaluation (the merge validated on the held-out split alone)
    stale = ("per_query_error", "per_query_mismatch")  # of an earlier try
    checked = q.per_query(a, data, folder, None)
    got = {**{k: v for k, v in got.items() if k not in stale}, **checked, "ndcg": checked.get("eval_ndcg")}
    keep(command, record, got)
    return got


def seeds_text(row: Result) -> str:
    """The per-seed column of the soup's row: its members, those greedy kept, and the soup's held-out figure."""
    kept = ", ".join(map(str, row.get("kept") or [])) or "-"
    held_out = f" (held-out {row['val_ndcg']:.4f})" if row.get("val_ndcg") is not None else ""
    return f"members {', '.join(map(str, row['members']))}; greedy kept {kept}{held_out}"
