"""Retrieval quality at equal steps and seed: in-batch negatives only vs + mined hard negatives vs + re-mining,
``loss=infonce`` vs ``loss=gte``, NDCG@10 on the held-out queries of the pydocs set (``gte_pro.data.pydocs``: API
summaries of installed packages -> their documentation, thousands of look-alike documents), over several seeds.

Usage::

    python benchmarks/bench_negatives.py [--seeds 1,2,3] [--variants inbatch-infonce,mined-gte,...]
        [--max-train 2000] [--max-test 500] [--epochs 2 | --steps N] [--negatives 1] [--model minilm]
        [--workdir /tmp/gte_pro_bench_negatives] [--override key=value ...] [--timeout S] [--json FILE] [--dry-run]
        [--reuse]

Every run is ``python train.py`` in a fresh process with the same overrides (model=minilm data=jsonl
data.train_file=<pydocs>/train.jsonl eval.beir=[<pydocs>/beir] model.lr=2e-5 data.batch_size=32
trainer.max_epochs=2, seed=S) plus its variant's:

  inbatch  data.num_negatives=0: the other pairs' positives are the only negatives
  mined    data.train_file=<work>/mined.jsonl data.num_negatives=K: hard negatives mined once, before training, by
           the untrained model (``python train.py mode=mine``, the same file for every seed and loss)
  remine   mined + data.remine.every_n_epochs=1: re-mined with the current weights at the start of epoch 2
  (each with -infonce and -gte: the loss's own default temperature, conf/loss/*.yaml)

The untrained model is evaluated once (``mode=eval``), the runs skip it (``eval.before=false``). The figure is
``val/<set>/ndcg@10`` of the run's ``metrics.json`` after the last step (``callbacks=none`` and no
checkpoints: no checkpoint selection, so every variant is scored at the same step count; the corpus is embedded
after training only, not after each epoch). Runs go one after the other; a failed run
is reported with its reason and the others go on. The table gives mean ± sample std over the seeds and each seed's
value; the summary says whether the best recipe beats in-batch negatives by more than the seed-to-seed spread.
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

RECIPES = ("inbatch", "mined", "remine")
LOSSES = ("infonce", "gte")
VARIANTS = tuple(f"{recipe}-{loss}" for recipe in RECIPES for loss in LOSSES)


def mine_command(args: argparse.Namespace, data: Path) -> list[str]:
    """Hard negatives for every training row, mined by the untrained model (the same for every seed)."""
    work = Path(args.workdir)
    return harness.train_command("mode=mine", f"model={args.model}", "data=jsonl",
                                 f"data.train_file={data / 'train.jsonl'}", f"mine.num_negatives={args.negatives}",
                                 f"mine.output={work / 'mined.jsonl'}", f"paths.cache_dir={work / 'cache'}",
                                 f"hydra.run.dir={work / 'runs' / 'mine'}", *args.override)


def train_command(variant: str, seed: int, args: argparse.Namespace, data: Path) -> list[str]:
    recipe, loss = variant.split("-")
    work = Path(args.workdir)
    train_file = data / "train.jsonl" if recipe == "inbatch" else work / "mined.jsonl"
    extra = {"inbatch": ["data.num_negatives=0"],
             "mined": [f"data.num_negatives={args.negatives}"],
             "remine": [f"data.num_negatives={args.negatives}", "data.remine.every_n_epochs=1"]}[recipe]
    return harness.train_command(*common_overrides(args, data), f"data.train_file={train_file}", f"loss={loss}",
                                 *extra, f"seed={seed}", f"hydra.run.dir={run_dir(variant, seed, args)}")


def mine_once(args: argparse.Namespace, data: Path) -> Result:
    """The mined file (``--reuse``: the one already there, if the mining command was the same)."""
    mined = recorded_run(mine_command(args, data), Path(args.workdir) / "runs" / "mine.json", args)
    return {"error": "no mining record"} if mined is None else mined


def run_dir(variant: str, seed: int, args: argparse.Namespace) -> Path:
    return Path(args.workdir) / "runs" / variant / f"seed{seed}"


def read_ndcg(folder: Path, set_name: str) -> dict[str, float | None]:
    """NDCG@10 on the test queries after training, from the run's metrics.json."""
    metrics = json.loads((folder / "metrics.json").read_text())
    return {"ndcg": (metrics.get("val") or {}).get(f"val/{set_name}/ndcg@10"), "steps": metrics.get("global_step")}


def train_one(variant: str, seed: int, args: argparse.Namespace, data: Path, mined: Result | None) -> Result:
    row = {"variant": variant, "seed": seed}
    if not variant.startswith("inbatch") and mined is not None and "error" in mined and not args.report:
        return {**row, "error": f"mining failed: {mined['error']}"}
    return train_recorded(train_command(variant, seed, args, data), run_dir(variant, seed, args), row, args,
                          lambda folder: read_ndcg(folder, (data / "beir").name))


def summarize(rows: list[Result], variants: list[str]) -> list[Result]:
    """One row per variant: mean ± std of NDCG@10 over its successful seeds, and each seed's value."""
    table = []
    for variant in variants:
        runs = [r for r in rows if r["variant"] == variant and not r.get("not_run")]
        values = [r["ndcg"] for r in runs if r.get("ndcg") is not None]
        if not values:
            failed = next((r for r in runs if "error" in r), {"error": "not run"})
            table.append({"variant": variant, "error": failed["error"]})
            continue
        table.append({"variant": variant, **mean_std(values),
                      "per_seed": ", ".join(f"{r['seed']}: {r['ndcg']:.4f}" if r.get("ndcg") is not None else
                                            f"{r['seed']}: failed" for r in runs),
                      "wall_s": statistics.mean(r["wall_s"] for r in runs if "wall_s" in r)})
    return table


def verdict(table: list[Result]) -> list[str]:
    """Per loss: does the best recipe with hard negatives beat in-batch only by more than the seed-to-seed spread?"""
    by_name = {r["variant"]: r for r in table if "mean" in r}
    lines = []
    for loss in LOSSES:
        base = by_name.get(f"inbatch-{loss}")
        others = [by_name[f"{recipe}-{loss}"] for recipe in RECIPES[1:] if f"{recipe}-{loss}" in by_name]
        if not base or not others:
            continue
        # the best recipe among those with a spread (2+ seeds), if the baseline has one too
        seeded = [r for r in others if r["std"] is not None]
        best = max(seeded or others, key=lambda r: r["mean"])
        margin = best["mean"] - base["mean"]
        if base["std"] is None or best["std"] is None:
            lines.append(f"{loss}: best {best['variant']} {margin:+.4f} NDCG@10 over inbatch-{loss}; the spread needs "
                         "2+ seeds of both")
            continue
        spread = max(base["std"], best["std"])
        lines.append(f"{loss}: best {best['variant']} {margin:+.4f} NDCG@10 over inbatch-{loss}; seed-to-seed std "
                     f"up to {spread:.4f}: {'beats' if margin > spread else 'does NOT beat'} in-batch by more than "
                     "the spread")
    return lines


def report(rows: list[Result], table: list[Result], args: argparse.Namespace, before: float | None) -> None:
    print_report(f"NDCG@10 on the pydocs test queries ({args.max_test} queries, {args.max_train} training pairs), "
                 f"model={args.model}, batch {args.batch_size}, lr {args.lr}, {length(args)}, {args.negatives} mined "
                 f"negative(s) per query; seeds {args.seeds}", None if before is None else f"{before:.4f}",
                 harness.table([
                     Column("variant", "variant", numeric=False, key=True), Column("NDCG@10 mean", "mean", ".4f"),
                     Column("± std", "std", ".4f"), Column("seeds", "n", "d"),
                     Column("per seed", "per_seed", numeric=False), Column("wall s / run", "wall_s", ".0f")], table),
                 verdict(table), rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, workdir="/tmp/gte_pro_bench_negatives", variants=VARIANTS)
    parser.add_argument("--negatives", type=int, default=1, help="mined hard negatives per query (data.num_negatives)")
    args = finish_arguments(parser, parser.parse_args(argv), VARIANTS)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = pydocs_set(args)
    needs_mining = any(not v.startswith("inbatch") for v in args.variant_list)
    commands = [untrained_command(args, data)] + ([mine_command(args, data)] if needs_mining else []) + [
        train_command(v, s, args, data) for s in args.seed_list for v in args.variant_list]
    if not announce(commands, args):
        return
    before = (untrained_metrics(args, data) or {}).get("ndcg@10")
    mined = mine_once(args, data) if needs_mining else None
    # seed-major order: a benchmark cut short still has every variant at the first seeds
    rows = [train_one(v, s, args, data, mined) for s in args.seed_list for v in args.variant_list]
    table = summarize(rows, args.variant_list)
    report(rows, table, args, before)
    save(args, commands, mine=mined, runs=rows, table=table)


if __name__ == "__main__":
    main()
