"""The teacher recipe, measured: does an embedder distilled from the project's own reranker beat one trained with
mined negatives? NDCG@10 on the held-out queries of the pydocs set (``gte_pro.data.pydocs``), equal steps, over
several seeds, with each pipeline's wall time.

Usage::

    python benchmarks/bench_teachers.py [--seeds 1,2,3] [--variants inbatch,mined,...] [--negatives 3]
        [--max-train 2000] [--max-test 500] [--epochs 2 | --steps N] [--model minilm] [--reranker reranker_minilm]
        [--reranker-lr 5e-5] [--reranker-steps N]
        [--rerank-depth 100] [--range-max 100] [--workdir /tmp/gte_pro_bench_teachers] [--override key=value ...]
        [--timeout S] [--json FILE] [--dry-run] [--reuse | --report]

Once, before the students (each ``python train.py`` in a fresh process, recorded for ``--reuse``):

  mine      ``mode=mine``: K hard negatives per row by the untrained embedder (``mined.jsonl``)
  reranker  ``task=rerank`` on ``mined.jsonl`` (groups of 1 + K), the same steps as a student; its validation
            reranks the untrained embedder's top ``--rerank-depth`` for each test query: the reranker's NDCG@10 and
            the embedder's own on the same lists
  rescore   ``mode=mine mine.rescore_with=<reranker>``: mined again, candidates the reranker scores at or above the
            positive dropped (``rescored.jsonl``, with the reranker's scores)
  score     ``mode=score score.teacher=<reranker>`` on ``mined.jsonl`` (``scored.jsonl``: the same negatives as
            ``mined``, with the reranker's scores)

After the ``mined`` students of every seed (they are the ensemble):

  ensemble  ``mode=score score.teacher=[<mined seed 1>,<mined seed 2>,...]`` on ``mined.jsonl``
            (``ensemble_scored.jsonl``: each member's cosines standardised over the file's pairs, averaged)

The students (the base overrides of ``benchmarks/pydocs_runs.py``, seed=S):

  inbatch          train.jsonl, data.num_negatives=0, loss=infonce
  mined            mined.jsonl, K negatives, loss=infonce
  rescored         rescored.jsonl, K negatives, loss=infonce
  distill          scored.jsonl, K negatives, loss=distill_kl loss.weight_infonce=0 (the teacher's distribution only)
  distill-infonce  scored.jsonl, K negatives, loss=distill_kl (+ InfoNCE's in-batch term, weight 1)
  distill-ensemble ensemble_scored.jsonl, K negatives, loss=distill_kl (+ InfoNCE, weight 1),
                   loss.teacher_temperature=--ensemble-temperature (the ensemble's scores are z-scores)

A pipeline's wall time is its student's plus the one-off steps it needs (mined: mine; rescored: mine, reranker,
rescore; distill: mine, reranker, score). The summary says whether the best distilled student beats ``mined`` by
more than the seed-to-seed spread, and whether the reranker beats the embedder it reranks.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import harness
from harness import Column, Result
from pydocs_runs import (
    add_arguments,
    announce,
    common_overrides,
    finish_arguments,
    length,
    mean_std,
    print_report,
    pydocs_set,
    recorded_run,
    save,
    train_recorded,
    untrained_command,
    untrained_metrics,
)

VARIANTS = ("inbatch", "mined", "rescored", "distill", "distill-infonce", "distill-ensemble")
# the one-off steps each student's file needs, in order
NEEDS = {"inbatch": (), "mined": ("mine",), "rescored": ("mine", "reranker", "rescore"),
         "distill": ("mine", "reranker", "score"), "distill-infonce": ("mine", "reranker", "score"),
         "distill-ensemble": ("mine", "ensemble")}
LATE_STEPS = ("ensemble",)  # run after every seed's ``mined`` student: those students are the ensemble


def work(args: argparse.Namespace) -> Path:
    return Path(args.workdir)


def runs(args: argparse.Namespace) -> Path:
    return work(args) / "runs"


def reranker_model(args: argparse.Namespace) -> Path:
    return runs(args) / "reranker" / "model"


def step_commands(args: argparse.Namespace, data: Path) -> dict[str, list[str]]:
    """The one-off steps' commands, by name."""
    cache = f"paths.cache_dir={work(args) / 'cache'}"
    mine_base = [f"model={args.model}", "data=jsonl", f"data.train_file={data / 'train.jsonl'}",
                 f"mine.num_negatives={args.negatives}", f"mine.range_max={args.range_max}", cache]
    student_like = [o for o in common_overrides(args, data) if not o.startswith(("model=", "model.lr="))]
    if args.reranker_steps:  # the reranker may train longer than a student: its wall time counts in the pipelines
        student_like = [o for o in student_like if not o.startswith("trainer.max_steps=")]
        student_like.append(f"trainer.max_steps={args.reranker_steps}")
    return {
        "mine": harness.train_command("mode=mine", *mine_base, f"mine.output={work(args) / 'mined.jsonl'}",
                                      f"hydra.run.dir={runs(args) / 'mine'}", *args.override),
        "reranker": harness.train_command(
            "task=rerank", *student_like, f"model={args.reranker}", f"model.lr={args.reranker_lr}",
            f"data.train_file={work(args) / 'mined.jsonl'}", f"data.num_negatives={args.negatives}",
            f"eval.rerank_depth={args.rerank_depth}", f"seed={args.seed_list[0]}",
            f"hydra.run.dir={runs(args) / 'reranker'}"),
        "rescore": harness.train_command("mode=mine", *mine_base, f"mine.rescore_with={reranker_model(args)}",
                                         "mine.relative_margin=null", f"mine.output={work(args) / 'rescored.jsonl'}",
                                         f"hydra.run.dir={runs(args) / 'rescore'}", *args.override),
        "score": harness.train_command("mode=score", "data=jsonl", f"data.train_file={work(args) / 'mined.jsonl'}",
                                       f"score.teacher={reranker_model(args)}", cache,
                                       f"score.output={work(args) / 'scored.jsonl'}",
                                       f"hydra.run.dir={runs(args) / 'score'}", *args.override),
        "ensemble": harness.train_command(
            "mode=score", "data=jsonl", f"data.train_file={work(args) / 'mined.jsonl'}", cache,
            "score.teacher=[" + ",".join(str(run_dir("mined", seed, args) / "model") for seed in args.seed_list) + "]",
            "score.teacher_kind=embedder", f"score.max_length={args.ensemble_max_length}",
            f"score.output={work(args) / 'ensemble_scored.jsonl'}", f"hydra.run.dir={runs(args) / 'ensemble'}",
            *args.override),
    }


def train_command(variant: str, seed: int, args: argparse.Namespace, data: Path) -> list[str]:
    files = {"inbatch": data / "train.jsonl", "mined": work(args) / "mined.jsonl",
             "rescored": work(args) / "rescored.jsonl", "distill": work(args) / "scored.jsonl",
             "distill-infonce": work(args) / "scored.jsonl", "distill-ensemble": work(args) / "ensemble_scored.jsonl"}
    # the benchmark measures distillation from whatever teacher the recipe made: a weak one is reported (its record
    # beside scored.jsonl), not refused
    weak = "loss.allow_weak_teacher=true"
    loss = {"distill": ["loss=distill_kl", "loss.weight_infonce=0", weak], "distill-infonce": ["loss=distill_kl", weak],
            "distill-ensemble": ["loss=distill_kl", f"loss.teacher_temperature={args.ensemble_temperature}", weak]}.get(
        variant, ["loss=infonce"])
    negatives = 0 if variant == "inbatch" else args.negatives
    return harness.train_command(*common_overrides(args, data), f"data.train_file={files[variant]}", *loss,
                                 f"data.num_negatives={negatives}", f"seed={seed}",
                                 f"hydra.run.dir={run_dir(variant, seed, args)}")


def run_dir(variant: str, seed: int, args: argparse.Namespace) -> Path:
    return runs(args) / variant / f"seed{seed}"


def wanted_steps(args: argparse.Namespace, late: bool) -> list[str]:
    return [step for step in ("mine", "reranker", "rescore", "score", "ensemble")
            if (step in LATE_STEPS) == late and any(step in NEEDS[v] for v in args.variant_list)]


def run_steps(args: argparse.Namespace, data: Path, late: bool = False,
              done: dict[str, Result] | None = None) -> dict[str, Result]:
    """The one-off steps the chosen students need (``late``: those after the ``mined`` students), in order; a step
    whose input failed is not run."""
    wanted = wanted_steps(args, late)
    commands, done = step_commands(args, data), dict(done or {})
    inputs = {"reranker": "mine", "rescore": "reranker", "score": "reranker", "ensemble": "mine"}
    for step in wanted:
        before = inputs.get(step)
        if before and "error" in done.get(before, {}):
            done[step] = {"error": f"{before} failed"}
            continue
        finish = (lambda result: _reranker_figures(result, args, data)) if step == "reranker" else (lambda r: r)
        got = recorded_run(commands[step], runs(args) / f"{step}.json", args, finish, clear=runs(args) / step)
        done[step] = got if got is not None else {"error": "not run (--report)"}
    return done


def _reranker_figures(result: Result, args: argparse.Namespace, data: Path) -> Result:
    """The reranker's NDCG@10 on the test queries and the embedder's own on the same candidate lists."""
    if "error" in result:
        return result
    val = json.loads((runs(args) / "reranker" / "metrics.json").read_text())["val"]
    prefix = f"val/{(data / 'beir').name}/"
    return {**result, "ndcg": val.get(prefix + "ndcg@10"), "retriever_ndcg": val.get(prefix + "retriever/ndcg@10")}


def read_ndcg(folder: Path, set_name: str) -> dict[str, float | None]:
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"ndcg": (metrics.get("val") or {}).get(f"val/{set_name}/ndcg@10"), "steps": metrics.get("global_step")}


def train_one(variant: str, seed: int, args: argparse.Namespace, data: Path, steps: dict[str, Result]) -> Result:
    row = {"variant": variant, "seed": seed}
    failed = [step for step in NEEDS[variant] if "error" in steps.get(step, {})]
    if failed and not args.report:
        return {**row, "error": f"{failed[0]} failed: {steps[failed[0]]['error']}"}
    return train_recorded(train_command(variant, seed, args, data), run_dir(variant, seed, args), row, args,
                          lambda folder: read_ndcg(folder, (data / "beir").name))


def summarize(rows: list[Result], args: argparse.Namespace, steps: dict[str, Result]) -> list[Result]:
    table = []
    for variant in args.variant_list:
        done = [r for r in rows if r["variant"] == variant and not r.get("not_run")]
        values = [r["ndcg"] for r in done if r.get("ndcg") is not None]
        if not values:
            table.append({"variant": variant, "error": next((r["error"] for r in done if "error" in r), "not run")})
            continue
        student_s = statistics.mean(r["wall_s"] for r in done if "wall_s" in r)
        once_s = sum(steps.get(step, {}).get("wall_s") or 0.0 for step in NEEDS[variant])
        table.append({"variant": variant, **mean_std(values),
                      "per_seed": ", ".join(f"{r['seed']}: {r['ndcg']:.4f}" for r in done if r.get("ndcg") is not None),
                      "student_s": student_s, "pipeline_s": student_s + once_s})
    return table


def verdict(table: list[Result], steps: dict[str, Result]) -> list[str]:
    lines, by_name = [], {r["variant"]: r for r in table if "mean" in r}
    reranker = steps.get("reranker", {})
    if reranker.get("ndcg") is not None and reranker.get("retriever_ndcg") is not None:
        gain = reranker["ndcg"] - reranker["retriever_ndcg"]
        lines.append(f"reranker: NDCG@10 {reranker['ndcg']:.4f} reranking the embedder's top candidates, against "
                     f"{reranker['retriever_ndcg']:.4f} for the embedder's own order ({gain:+.4f}): "
                     f"{'above' if gain > 0 else 'NOT above'} the embedder it reranks")
    base = by_name.get("mined")
    distilled = [by_name[v] for v in ("distill", "distill-infonce", "distill-ensemble") if v in by_name]
    if base and "distill-ensemble" in by_name:
        gain = by_name["distill-ensemble"]["mean"] - base["mean"]
        lines.append(f"distill-ensemble {gain:+.4f} NDCG@10 over mined (mean of seeds; goal: +0.005): "
                     f"{'met' if gain >= 0.005 else 'NOT met'}")
    if base and distilled:
        best = max(distilled, key=lambda r: r["mean"])
        margin = best["mean"] - base["mean"]
        if base["std"] is None or best["std"] is None:
            lines.append(f"best distilled ({best['variant']}) {margin:+.4f} NDCG@10 over mined; the spread needs "
                         "2+ seeds")
        else:
            spread = max(base["std"], best["std"])
            lines.append(f"best distilled ({best['variant']}) {margin:+.4f} NDCG@10 over mined; seed-to-seed std up "
                         f"to {spread:.4f}: {'beats' if margin > spread else 'does NOT beat'} mined InfoNCE by more "
                         "than the spread")
    return lines


def report(rows: list[Result], table: list[Result], args: argparse.Namespace, before: float | None,
           steps: dict[str, Result]) -> None:
    print_report(f"NDCG@10 on the pydocs test queries ({args.max_test} queries, {args.max_train} training pairs), "
                 f"student model={args.model}, reranker model={args.reranker}, batch {args.batch_size}, lr {args.lr} "
                 f"(reranker {args.reranker_lr}), {length(args)}, {args.negatives} negatives per row; seeds "
                 f"{args.seeds}", None if before is None else f"{before:.4f}",
                 harness.table([
                     Column("variant", "variant", numeric=False, key=True), Column("NDCG@10 mean", "mean", ".4f"),
                     Column("± std", "std", ".4f"), Column("seeds", "n", "d"),
                     Column("per seed", "per_seed", numeric=False), Column("student s", "student_s", ".0f"),
                     Column("pipeline s", "pipeline_s", ".0f")], table),
                 [*(step_line(name, result) for name, result in steps.items()), *verdict(table, steps)], rows)


def step_line(name: str, result: Result) -> str:
    if "error" in result:
        return f"{name}: failed: {result['error']}"
    return f"{name}: {result.get('wall_s', 0.0):.0f} s"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, workdir="/tmp/gte_pro_bench_teachers", variants=VARIANTS)
    parser.add_argument("--negatives", type=int, default=3, help="hard negatives per row (mined, and in each group)")
    parser.add_argument("--reranker", default="reranker_minilm", help="the reranker's model= option")
    parser.add_argument("--reranker-lr", default="5e-5")
    parser.add_argument("--reranker-steps", type=int, default=None,
                        help="the reranker's trainer.max_steps (with --steps; default: the students' --steps)")
    parser.add_argument("--rerank-depth", type=int, default=100)
    parser.add_argument("--range-max", type=int, default=100,
                        help="mine.range_max of both minings: the window a teacher rescores (range_min is 10)")
    parser.add_argument("--ensemble-temperature", default="0.5",
                        help="distill-ensemble's loss.teacher_temperature: its scores are z-scores, about cosines / "
                             "their std (~0.1), so 0.5 reads them as cosines at 0.05, a sentence-transformers "
                             "embedder's training temperature")
    parser.add_argument("--ensemble-max-length", type=int, default=128, help="score.max_length of the ensemble")
    return finish_arguments(parser, parser.parse_args(argv), VARIANTS)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = pydocs_set(args)
    if "distill-ensemble" in args.variant_list and "mined" not in args.variant_list:
        raise SystemExit("--variants: distill-ensemble needs mined (its students are the ensemble)")
    early = [v for v in args.variant_list if not set(NEEDS[v]) & set(LATE_STEPS)]
    late = [v for v in args.variant_list if v not in early]
    commands = [untrained_command(args, data), *(step_commands(args, data)[s] for s in wanted_steps(args, False))]
    commands += [train_command(v, s, args, data) for s in args.seed_list for v in early]
    commands += [*(step_commands(args, data)[s] for s in wanted_steps(args, True))]
    commands += [train_command(v, s, args, data) for s in args.seed_list for v in late]
    if not announce(commands, args):
        return
    before = (untrained_metrics(args, data) or {}).get("ndcg@10")
    steps = run_steps(args, data)
    # seed-major order: a benchmark cut short still has every variant at the first seeds
    rows = [train_one(v, s, args, data, steps) for s in args.seed_list for v in early]
    if late:
        steps = run_steps(args, data, late=True, done=steps)
        rows += [train_one(v, s, args, data, steps) for s in args.seed_list for v in late]
    table = summarize(rows, args, steps)
    report(rows, table, args, before, steps)
    save(args, commands, steps=steps, runs=rows, table=table)


if __name__ == "__main__":
    main()
