"""A quality benchmark that decides: NDCG@10 of each training recipe on two offline retrieval sets of different
kinds, 3 seeds of one full epoch each, and a paired per-query bootstrap interval of its difference to mined InfoNCE.

Usage::

    python benchmarks/bench_quality.py [--sets pydocs,stdcode] [--variants inbatch,mined-7,...] [--seeds 1,2,3]
        [--max-train 2200] [--max-test 500] [--epochs 1] [--max-length 128] [--workdir /tmp/gte_pro_bench_quality]
        [--override key=value ...] [--timeout S] [--json FILE] [--dry-run] [--reuse | --report]

The sets (``quality_sets.py``; at the defaults each 2,200 pairs, of which ~2,090 train (a run holds out 5%), and 500
test queries over 4,700 documents):
``pydocs`` (summary of a third-party API function -> its signature and docstring) and ``stdcode`` (summary of a
standard-library function -> its code). Per set, once: ``mode=eval`` of the untrained model, and ``mode=mine``:
7 hard negatives per row by the untrained model, window 10-50, relative margin 0.05 (``mined.jsonl``). Every
variant of ours trains on that file (``data.num_negatives`` picks how many it uses), so at a seed all of them see
the same rows in the same order; the base overrides of ``pydocs_runs.py`` (model=minilm, lr 2e-5, batch 32,
validation after the epoch only, no checkpoints), ``trainer.max_epochs=1`` (no step cap), ``data.max_length=128``,
``loss=infonce loss.temperature=0.05``, and:

  inbatch            data.num_negatives=0
  mined-1/-3/-7      data.num_negatives=1/3/7 (mined-7 is the reference of every interval)
  mined-7-fnm        + loss.false_negative_margin=0.1      mined-7-hard   + loss.hardness_alpha=5
  mined-7-both       + both                                mined-7-t0.02  loss.temperature=0.02
  mined-7-gist       + loss.guide=all-mpnet-base-v2 (GISTEmbed's guided masking; ``make fetch-mpnet`` first)
  mined-7-shuffled   + data.group_by_length=false (random batches, as the peer's trainer draws them)
  distill-ensemble   ``mode=score score.teacher=[<mined-7 seed A>/model,<seed B>/model]`` (the first two seeds) on
                     mined.jsonl, then ``experiment=distill`` (distill_kl + InfoNCE, 7 negatives) on its file,
                     loss.teacher_temperature=--ensemble-temperature
  soup               ``mode=merge merge.method=greedy merge.models=[<mined-7 seed>/model,...]`` of every seed's
                     finished mined-7 (>= 2), after them; greedy ranks and keeps members by the held-out split of
                     mined.jsonl (optimized_metric=val/ndcg@10, data.val_distractors=10000, no eval.beir: never the
                     test set); one run per set, its seeds column the number of members
  st-peer            sentence-transformers: ``util.mine_hard_negatives`` (7 negatives, range_min=10, range_max=50,
                     relative_margin=0.05, top) and its trainer with MultipleNegativesRankingLoss (scale 20), the same
                     model, lr, batch, epoch, seed and schedule; scored by our evaluation

Each run's exported model (``<run>/model``) is evaluated again (``quality_eval.py``: ``mode=eval`` with each query's
NDCG@10 written out); their mean must equal the run's own ``val/<set>/ndcg@10`` to 1e-6 (a mismatch is printed).
Per variant: mean +- sample std over seeds, the paired bootstrap (per query, each variant's scores averaged over its
seeds, --resamples resamples of the queries, rng seed 0) 95% interval of its difference to mined-7, and its
pipeline's wall time (its run, plus the mining where it uses mined negatives; distill-ensemble also its two
members' runs and the scoring; st-peer its mining, training and evaluation; the soup its merge and evaluation, its
members' runs and the mining). Over sets: means of the per-set figures, the interval from the queries of each set
resampled within the set. A failed run is reported with its reason.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import harness
import quality_runs as q
import quality_soup
from harness import Column, Result
from pydocs_runs import (
    add_arguments,
    announce,
    finish_arguments,
    keep,
    mean_std,
    paired_bootstrap,
    planned_duration,
    print_report,
    recorded_run,
    save,
    train_recorded,
    untrained_command,
    untrained_metrics,
)
from quality_sets import SETS, build_set, sizes

LATE = ("distill-ensemble",)  # after every seed's mined-7: its members
SCORED_AFTER = ("st-peer", "soup")  # their test figure is the per-query evaluation's: its time is the pipeline's


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.parser(__doc__)
    add_arguments(parser, workdir="/tmp/gte_pro_bench_quality", variants=q.VARIANTS)
    # data=jsonl holds out data.val_fraction (0.05) of train.jsonl: 2,200 pairs leave >= 2,000 to train on
    parser.set_defaults(epochs=1, max_train=2200)
    parser.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, of {', '.join(SETS)}")
    parser.add_argument("--max-length", type=int, default=128, help="data.max_length of every run (and the peer's)")
    parser.add_argument("--ensemble-temperature", default="0.1", help="distill-ensemble's loss.teacher_temperature "
                        "(z-scores; 0.1 beat 0.5 in docs/benchmarks.md's ensemble probe)")
    parser.add_argument("--resamples", type=int, default=2000, help="bootstrap resamples of the queries")
    parser.add_argument("--train-rate", type=float, default=15.0, help="modelled training texts/s (planned time)")
    parser.add_argument("--encode-rate", type=float, default=20.0, help="modelled encoding texts/s (planned time)")
    args = finish_arguments(parser, parser.parse_args(argv), q.VARIANTS)
    args.set_list = args.sets.split(",")
    if unknown := sorted(set(args.set_list) - set(SETS)):
        parser.error(f"--sets: unknown {', '.join(unknown)}; valid choices: {', '.join(SETS)}")
    for needs in ("distill-ensemble", "soup"):
        if needs in args.variant_list and q.REFERENCE not in args.variant_list:
            parser.error(f"--variants: {needs} needs mined-7 (its members)")
    args.override = [f"data.max_length={args.max_length}", *args.override]
    return args


def set_sizes(args: argparse.Namespace, data: Path) -> dict[str, int]:
    if (data / "beir" / "corpus.jsonl").is_file():
        return sizes(data)
    return {"train_pairs": round(args.max_train * 0.95), "test_queries": args.max_test, "documents": args.max_train +
            args.max_test + 2000}


def plan(args: argparse.Namespace, name: str, data: Path) -> list[tuple[list[str], Path, float]]:
    """(command, record, modelled seconds) of every run on the set, in order (the variants seed-major)."""
    a, n = q.set_args(args, name), set_sizes(args, data)
    rows, test = n["train_pairs"], n["test_queries"] + n["documents"]
    start, enc = 30.0, lambda texts: texts / args.encode_rate  # noqa: E731

    def student(k: int) -> float:  # training, its own final validation, the per-query evaluation
        return 2 * start + rows * (2 + k) * args.epochs / args.train_rate + 2 * enc(test)

    steps = [(untrained_command(a, data), q.runs(a) / "untrained.json", start + enc(test)),
             (q.mine_command(a, data), q.runs(a) / "mine.json", start + enc(2 * rows))]
    early = [v for v in args.variant_list if v not in LATE and v != quality_soup.VARIANT]
    for seed in args.seed_list:
        for v in early:
            k = q.NUM_NEGATIVES.get(v, q.NEGATIVES)
            cmd = q.st_peer_command(seed, a, data) if v == "st-peer" else q.train_command(v, seed, a, data)
            steps.append((cmd, q.run_dir(v, seed, a).with_suffix(".json"), student(k) + enc(2 * rows)
                          * (v == "st-peer")))
    if quality_soup.VARIANT in args.variant_list and len(args.seed_list) > 1:
        k = len(args.seed_list)  # each member validated, greedy's k - 1 candidate soups, then the test set once
        steps.append((q.soup_command(a, args.seed_list), q.soup_dir(a).with_suffix(".json"),
                      2 * start + (2 * k - 1) * enc(1.1 * rows) + enc(test)))
    if "distill-ensemble" in args.variant_list:
        steps.append((q.score_command(a), q.runs(a) / "score.json", start + enc(2 * rows) * len(q.members(a))))
        steps += [(q.train_command("distill-ensemble", s, a, data),
                   q.run_dir("distill-ensemble", s, a).with_suffix(".json"), student(q.NEGATIVES))
                  for s in args.seed_list]
    return steps


def read_ours(data: Path, folder: Path) -> Result:
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"ndcg": (metrics.get("val") or {}).get(f"val/{(data / 'beir').name}/ndcg@10"),
            "steps": metrics.get("global_step")}


def with_per_query(result: Result, command: list[str], a: argparse.Namespace, data: Path, folder: Path) -> Result:
    """The run's per-query scores, computed once (also for a kept run without them) and kept in its record."""
    if result.get("ndcg") is None or result.get("per_query") or a.report:
        return result
    stale = ("per_query_error", "per_query_mismatch")  # of an earlier try
    result = {**{k: v for k, v in result.items() if k not in stale}, **q.per_query(a, data, folder, result["ndcg"])}
    keep(command, folder.with_suffix(".json"), result)
    return result


def run_set(args: argparse.Namespace, name: str) -> tuple[list[Result], dict[str, Result], float | None]:
    a = q.set_args(args, name)
    data = build_set(name, Path(args.workdir) / "sets", args.max_train, args.max_test)
    before = (untrained_metrics(a, data) or {}).get("ndcg@10")
    steps = {"mine": recorded_run(q.mine_command(a, data), q.runs(a) / "mine.json", a, clear=q.runs(a) / "mine")
             or {"error": "not run (--report)"}}

    def one(variant: str, seed: int) -> Result:
        row = {"variant": variant, "seed": seed}
        failed = next((s for s in ("mine", "score") if "error" in steps.get(s, {})
                       and (s == "mine" or variant in LATE)), None)
        if failed and not args.report:
            return {**row, "error": f"{failed} failed: {steps[failed]['error']}"}
        if variant == "st-peer":
            return q.run_peer(seed, a, data)
        command, folder = q.train_command(variant, seed, a, data), q.run_dir(variant, seed, a)
        got = train_recorded(command, folder, row, a, lambda done: read_ours(data, done))
        return with_per_query(got, command, a, data, folder)

    early = [v for v in args.variant_list if v not in LATE and v != quality_soup.VARIANT]
    rows = [one(v, s) for s in args.seed_list for v in early]
    if quality_soup.VARIANT in args.variant_list:  # after its members, the seeds' mined-7 runs
        rows.append(quality_soup.run_soup(a, data, rows))
    if any(v in LATE for v in args.variant_list):
        if len(q.members(a)) < 2:
            steps["score"] = {"error": "the ensemble needs 2 seeds (its members: mined-7 of the first two)"}
        else:
            steps["score"] = recorded_run(q.score_command(a), q.runs(a) / "score.json", a,
                                          clear=q.runs(a) / "score") or {"error": "not run (--report)"}
        rows += [one(v, s) for s in args.seed_list for v in args.variant_list if v in LATE]
    return [{**r, "set": name} for r in rows], steps, before


def pipeline_s(variant: str, done: list[Result], steps: dict[str, Result], rows: list[Result],
               members: list[int]) -> float:
    """A variant's mean run plus the one-off steps it needs (st-peer: its mining and training, plus evaluation; the
    soup: its merge and evaluation, its members' runs and the mining)."""
    own = statistics.mean((r.get("wall_s") or 0.0) + (r.get("eval_s") or 0.0) * (variant in SCORED_AFTER)
                          for r in done)
    once, built = 0.0, variant in (*LATE, quality_soup.VARIANT)  # on mined-7 runs: its members
    if variant.startswith("mined") or built:
        once += steps.get("mine", {}).get("wall_s") or 0.0
    if built:
        members = done[0]["members"] if variant == quality_soup.VARIANT else members
        once += (steps.get("score", {}).get("wall_s") or 0.0) * (variant in LATE) + sum(
            r.get("wall_s") or 0.0 for r in rows if r["variant"] == q.REFERENCE and r["seed"] in members)
    return own + once


def summarize(rows: list[Result], args: argparse.Namespace, steps: dict[str, dict[str, Result]]) -> list[Result]:
    """One row per (set, variant), then the average over the sets ("all") of the variants every set has."""
    import numpy as np

    table, scores = [], {}
    for name in args.set_list:
        for variant in args.variant_list:
            got = [r for r in rows if r["set"] == name and r["variant"] == variant and not r.get("not_run")]
            done = [r for r in got if r.get("ndcg") is not None]
            if not done:
                first = next((r for r in got if "error" in r or "skipped" in r), {"error": "not run"})
                table.append({"set": name, "variant": variant, **{k: first[k] for k in ("error", "skipped")
                                                                  if k in first}})
                continue
            scored = [r["per_query"] for r in done if r.get("per_query")]
            if scored:
                scores[name, variant] = np.mean(scored, axis=0)
            table.append({"set": name, "variant": variant, **mean_std([r["ndcg"] for r in done]),
                          "per_seed": ", ".join(f"{r['seed']}: {r['ndcg']:.4f}" for r in done),
                          "pipeline_s": pipeline_s(variant, done, steps[name],
                                                       [r for r in rows if r["set"] == name], args.seed_list[:2])})
            if variant == quality_soup.VARIANT:  # one run of len(members) models: no spread over seeds
                table[-1].update(n=len(done[0]["members"]), std=None, per_seed=quality_soup.seeds_text(done[0]))
    for variant in args.variant_list:
        per_set = [r for r in table if r["variant"] == variant and "mean" in r]
        if len(args.set_list) > 1 and len(per_set) == len(args.set_list):
            table.append({"set": "all", "variant": variant, "mean": statistics.mean(r["mean"] for r in per_set),
                          "n": min(r["n"] for r in per_set),
                          "pipeline_s": statistics.mean(r["pipeline_s"] for r in per_set)})
    for row in table:
        names = args.set_list if row["set"] == "all" else [row["set"]]
        pairs = [(scores.get((n, row["variant"])), scores.get((n, q.REFERENCE))) for n in names]
        if "mean" in row and row["variant"] != q.REFERENCE and all(v is not None and r is not None for v, r in pairs):
            delta, low, high = paired_bootstrap([v for v, _ in pairs], [r for _, r in pairs], args.resamples)
            row.update(delta=delta, low=low, high=high,
                       decision="better" if low > 0 else "worse" if high < 0 else "undecided")
    return table


def interval(row: Result) -> str | None:
    return f"[{row['low']:+.4f}, {row['high']:+.4f}]" if "low" in row else None


def report(rows: list[Result], table: list[Result], args: argparse.Namespace, steps: dict[str, dict[str, Result]],
           before: dict[str, float | None]) -> None:
    columns = [Column("set", "set", numeric=False, key=True), Column("variant", "variant", numeric=False, key=True),
               Column("NDCG@10 mean", "mean", ".4f"), Column("± std", "std", ".4f"), Column("seeds", "n", "d"),
               Column(f"Δ vs {q.REFERENCE}", "delta", "+.4f"), Column("95% CI (paired bootstrap)", interval),
               Column("decision", "decision", numeric=False), Column("pipeline s", "pipeline_s", ".0f"),
               Column("per seed", "per_seed", numeric=False)]
    after = [f"{name} {step}: {'failed: ' + r['error'] if 'error' in r else format(r.get('wall_s') or 0, '.0f') + ' s'}"
             for name, s in steps.items() for step, r in s.items()]
    after += [f"per-query check: {r['set']} {r['variant']} seed {r['seed']}: {r['per_query_mismatch']}"
              for r in rows if r.get("per_query_mismatch")]
    after += [f"per-query scores missing: {r['set']} {r['variant']} seed {r['seed']}: {r['per_query_error']}"
              for r in rows if r.get("per_query_error")]
    print_report(f"NDCG@10 on {args.sets} ({args.max_train} training pairs, {args.max_test} test queries per set), "
                 f"model={args.model}, batch {args.batch_size}, lr {args.lr}, {args.epochs} epoch(s), max_length "
                 f"{args.max_length}; seeds {args.seeds}; intervals: {args.resamples} resamples",
                 ", ".join(f"{n} {v:.4f}" for n, v in before.items() if v is not None) or None,
                 harness.table(columns, table), after, rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sets = {name: build_set(name, Path(args.workdir) / "sets", args.max_train, args.max_test, dry_run=True)
            for name in args.set_list}
    planned = [step for name, data in sets.items() for step in plan(args, name, data)]
    go = announce([command for command, _, _ in planned], args)
    print(planned_duration(planned, args, f"{args.train_rate:g} training and {args.encode_rate:g} encoding texts/s "
                           "and 30 s a process (2 shared CPU cores)"), flush=True)
    if not go:
        return
    rows, steps, before = [], {}, {}
    for name in args.set_list:
        got, steps[name], before[name] = run_set(args, name)
        rows += got
    table = summarize(rows, args, steps)
    report(rows, table, args, steps, before)
    save(args, [command for command, _, _ in planned], steps=steps, runs=rows, table=table, untrained=before)


if __name__ == "__main__":
    main()
