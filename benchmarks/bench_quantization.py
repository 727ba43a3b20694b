"""Quantization-aware training (``loss.quantization_aware``) against a plain run: float32, int8 and binary NDCG@10
(``eval.quantization``) on the pydocs test set and on a second retrieval set, seeds x variants at equal steps.

Usage::

    python benchmarks/bench_quantization.py [--variants plain,qat,qat-binary] [--seeds 1,2,3] [--max-train 1000]
        [--max-test 200] [--steps 20] [--quantization-weight 1.0] [--workdir /tmp/gte_pro_bench_quantization]
        [--override key=value ...] [--reuse] [--report] [--dry-run]

Every run is ``python train.py`` in a fresh process with the base overrides of the pydocs benchmarks (model=minilm
data=jsonl on pydocs, infonce, in-batch negatives only, model.lr=2e-5, batch 32, validation after the last step
only, no checkpoints) and ``eval.quantization=[int8,binary]`` plus its variant's:

  plain       nothing more
  qat         loss.quantization_aware=[binary,int8] loss.quantization_weight=--quantization-weight
  qat-binary  loss.quantization_aware=[binary], the same weight

The second set ("stdlib") is the held-out split of the offline demo corpus (standard-library docstring summary ->
body, a different source from pydocs' installed packages) written as a BEIR folder: its queries, their documents and
the demo's 1,000 distractors. No real BEIR set (scifact, nfcorpus, ...) is available offline here; pass one with
``--override 'eval.beir=[...]'`` where there is. The untrained model's row is ``mode=eval`` on both sets.
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
)

VARIANTS = ("plain", "qat", "qat-binary")
PRECISIONS = ("float", "int8", "binary")
QUANTIZATION = "eval.quantization=[int8,binary]"
SET_LABELS = {"beir": "pydocs"}  # the pydocs set's BEIR folder is named beir


def stdlib_set(args: argparse.Namespace) -> Path:
    """The demo corpus's held-out pairs as a BEIR folder (built once): queries, their documents, the distractors."""
    folder = Path(args.workdir) / "stdlib"
    if args.dry_run or (folder / "qrels" / "test.tsv").is_file():
        return folder
    splits = harness.demo_splits(harness.CACHE_DIR)
    docs = list(dict.fromkeys([ex.positives[0] for ex in splits.val] + list(splits.distractors)))
    ids = {doc: f"d{i}" for i, doc in enumerate(docs)}
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": ids[d], "title": "", "text": d}) + "\n"
                                                 for d in docs))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": ex.query}) + "\n"
                                                  for i, ex in enumerate(splits.val)))
    qrels = "".join(f"q{i}\t{ids[ex.positives[0]]}\t1\n" for i, ex in enumerate(splits.val))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels)
    return folder


def sets(data: Path, args: argparse.Namespace) -> list[Path]:
    return [data / "beir", stdlib_set(args)]


def eval_sets(data: Path, args: argparse.Namespace) -> str:
    return f"eval.beir=[{','.join(str(s) for s in sets(data, args))}]"


def train_command(variant: str, seed: int, args: argparse.Namespace, data: Path) -> list[str]:
    base = [o if not o.startswith("eval.beir=") else eval_sets(data, args) for o in common_overrides(args, data)]
    precisions = {"qat": "[binary,int8]", "qat-binary": "[binary]"}.get(variant)
    extra = [f"loss.quantization_aware={precisions}", f"loss.quantization_weight={args.quantization_weight}"]
    return harness.train_command(*base, f"data.train_file={data / 'train.jsonl'}", "loss=infonce",
                                 "data.num_negatives=0", QUANTIZATION, *(extra if precisions else []),
                                 f"seed={seed}", f"hydra.run.dir={run_dir(variant, seed, args)}")


def untrained_command(args: argparse.Namespace, data: Path) -> list[str]:
    work = Path(args.workdir)
    return harness.train_command("mode=eval", f"model={args.model}", eval_sets(data, args), QUANTIZATION,
                                 f"paths.cache_dir={work / 'cache'}", f"hydra.run.dir={work / 'runs' / 'untrained'}",
                                 *args.override)


def run_dir(variant: str, seed: int, args: argparse.Namespace) -> Path:
    return Path(args.workdir) / "runs" / variant / f"seed{seed}"


def figures(val: dict[str, float], names: list[str]) -> Result:
    """``<set>/<precision>`` NDCG@10 from a run's ``val`` metrics."""
    suffix = {"float": "", "int8": "_int8", "binary": "_binary"}
    return {f"{name}/{p}": val.get(f"val/{name}/ndcg@10{suffix[p]}") for name in names for p in PRECISIONS}


def read_run(folder: Path, names: list[str]) -> Result:
    metrics = json.loads((folder / "metrics.json").read_text())
    return {**figures(metrics.get("val") or {}, names), "steps": metrics.get("global_step"),
            "train_s": (metrics.get("timing") or {}).get("training")}


def untrained(args: argparse.Namespace, data: Path, names: list[str]) -> Result | None:
    runs = Path(args.workdir) / "runs"

    def finish(result: Result) -> Result:
        if "error" in result:
            return result
        return figures(json.loads((runs / "untrained" / "metrics.json").read_text())["val"], names)

    got = recorded_run(untrained_command(args, data), runs / "untrained.json", args, finish)
    return None if got is None or "error" in got else got


def summarize(rows: list[Result], names: list[str], args: argparse.Namespace,
              before: Result | None) -> list[Result]:
    """One row per (set, variant): mean ± std over seeds of each precision and the float - binary gap."""
    table = []
    for name in names:
        label = SET_LABELS.get(name, name)
        if before:
            table.append({"set": label, "variant": "untrained", **{p: before[f"{name}/{p}"] for p in PRECISIONS},
                          "gap": before[f"{name}/float"] - before[f"{name}/binary"], "n": 1})
        for variant in args.variant_list:
            runs = [r for r in rows if r["variant"] == variant and r.get(f"{name}/float") is not None]
            if not runs:
                table.append({"set": label, "variant": variant, "error": "not run"})
                continue
            row = {"set": label, "variant": variant, "n": len(runs),
                   "seeds": ",".join(str(r["seed"]) for r in runs)}
            for p in PRECISIONS:
                stats = mean_std([r[f"{name}/{p}"] for r in runs])
                row[p], row[f"{p}_std"] = stats["mean"], stats["std"]
            row["gap"] = statistics.mean(r[f"{name}/float"] - r[f"{name}/binary"] for r in runs)
            table.append(row)
    return table


def verdicts(table: list[Result], names: list[str]) -> list[str]:
    """The issue's goals: binary within 2 points of float (qat), qat's float no more than 0.3 points below plain."""
    lines = []
    for name in names:
        name = SET_LABELS.get(name, name)
        got = {r["variant"]: r for r in table if r["set"] == name and "error" not in r}
        for variant in ("qat", "qat-binary"):
            lines += _verdict(name, variant, got)
    return lines


def _verdict(name: str, variant: str, got: dict[str, Result]) -> list[str]:
    if variant not in got:
        return []
    qat = got[variant]
    lines = [f"{name}: {variant} float - binary gap {100 * qat['gap']:.2f} points (goal <= 2): "
             f"{'met' if qat['gap'] <= 0.02 else 'NOT met'}"]
    if "plain" in got:
        drop = got["plain"]["float"] - qat["float"]
        lines.append(f"{name}: {variant} float vs plain {-100 * drop:+.2f} points (goal >= -0.3): "
                     f"{'met' if drop <= 0.003 else 'NOT met'}; plain gap {100 * got['plain']['gap']:.2f}")
    return lines


def report(rows: list[Result], table: list[Result], names: list[str], args: argparse.Namespace) -> None:
    columns = [Column("set", "set", numeric=False, key=True), Column("variant", "variant", numeric=False, key=True),
               Column("seeds", "n", "d")]
    for p in PRECISIONS:
        columns += [Column(f"{p} NDCG@10", p, ".4f"), Column("± std", f"{p}_std", ".4f")]
    columns.append(Column("float - binary", "gap", ".4f"))
    print_report(f"pydocs test queries ({args.max_test}) and stdlib held-out, {args.max_train} training pairs, "
                 f"model={args.model}, batch {args.batch_size}, lr {args.lr}, {length(args)}, quantization_weight "
                 f"{args.quantization_weight}; seeds {args.seeds}", None, harness.table(columns, table),
                 verdicts(table, names), rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, workdir="/tmp/gte_pro_bench_quantization", variants=VARIANTS)
    parser.add_argument("--quantization-weight", default="1.0", help="loss.quantization_weight of the qat runs")
    parser.set_defaults(max_train=1000, max_test=200, steps=20)
    return finish_arguments(parser, parser.parse_args(argv), VARIANTS)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = pydocs_set(args)
    names = [s.name for s in sets(data, args)]
    commands = [untrained_command(args, data)] + [
        train_command(v, s, args, data) for s in args.seed_list for v in args.variant_list]
    if not announce(commands, args):
        return
    before = untrained(args, data, names)
    rows = [train_recorded(train_command(v, s, args, data), run_dir(v, s, args), {"variant": v, "seed": s}, args,
                           lambda folder: read_run(folder, names))
            for s in args.seed_list for v in args.variant_list]
    table = summarize(rows, names, args, before)
    report(rows, table, names, args)
    save(args, commands, runs=rows, table=table, untrained=before)


if __name__ == "__main__":
    main()
