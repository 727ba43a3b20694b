"""The training options of issue 12 against a plain full fine-tune, at equal steps and seed on the pydocs set (API
summaries of installed packages -> their documentation): NDCG@10 at the full width and truncated, trainable
parameters, training samples/s and peak RSS.

Usage::

    python benchmarks/bench_options.py [--variants full,lora,matryoshka,projection] [--seeds 1]
        [--max-train 2000] [--max-test 500] [--epochs 2 | --steps N] [--dims 256,128,64] [--lora-lr 2e-4]
        [--workdir /tmp/gte_pro_bench_options] [--override key=value ...] [--reuse] [--report] [--dry-run]

Every run is ``python train.py`` in a fresh process with the base overrides of the negatives benchmark (model=minilm
data=jsonl on pydocs, infonce, in-batch negatives only, model.lr=2e-5, batch 32, validation after the last step
only, no checkpoints, ``eval.truncate_dims`` = --dims; here no validation inside trainer.fit at all, and the
throughput meter on) plus its variant's:

  full        nothing more: every weight trains
  lora        model.lora={r: 16, alpha: 32, dropout: 0.1} (peft's default targets for BERT: query and value) at
              model.lr=--lora-lr: adapters want a learning rate ~10x a full fine-tune's
  matryoshka  loss.matryoshka_dims=[<width>, *--dims]: the loss at every width, summed with weight 1
  projection  model.projection={dims: [512, 512], activation: relu, dropout: 0.1}: the original recipe's head

The figures come from each run's ``metrics.json``: ``val/<set>/ndcg@10`` and ``val/<set>/dim<d>/ndcg@10``,
``parameters.trainable``, samples/s (training steps x batch / the training phase's seconds) and the peak RSS when
training ended (``peak_rss_mb.training``: model, optimizer state and activations; the later phases embed the corpus).
"""

from __future__ import annotations

import argparse
import json
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
    save,
    train_recorded,
    untrained_command,
    untrained_metrics,
)

VARIANTS = ("full", "lora", "matryoshka", "projection")
WIDTH = {"minilm": 384}  # the embedding width of the models the matryoshka variant knows


def variant_overrides(variant: str, args: argparse.Namespace) -> list[str]:
    if variant == "lora":
        return ["model.lora={r: 16, alpha: 32, dropout: 0.1}", f"model.lr={args.lora_lr}"]
    if variant == "matryoshka":
        return [f"loss.matryoshka_dims=[{','.join(str(d) for d in [WIDTH[args.model], *args.dim_list])}]"]
    if variant == "projection":
        return ["model.projection={dims: [512, 512], activation: relu, dropout: 0.1}"]
    return []


def train_command(variant: str, seed: int, args: argparse.Namespace, data: Path) -> list[str]:
    # matryoshka's truncate_dims follow its loss dims; the others are told the same dims
    return harness.train_command(
        *common_overrides(args, data, validate_in_fit=False),
        "+callbacks.throughput._target_=gte_pro.training.callbacks.Throughput",
        f"data.train_file={data / 'train.jsonl'}",
        "loss=infonce", "data.num_negatives=0", f"eval.truncate_dims=[{','.join(map(str, args.dim_list))}]",
        *variant_overrides(variant, args), f"seed={seed}", f"hydra.run.dir={run_dir(variant, seed, args)}")


def run_dir(variant: str, seed: int, args: argparse.Namespace) -> Path:
    return Path(args.workdir) / "runs" / variant / f"seed{seed}"


def read_figures(folder: Path, set_name: str, dims: list[int], batch_size: int) -> Result:
    metrics = json.loads((folder / "metrics.json").read_text())
    val = metrics.get("val") or {}
    return {"ndcg": val.get(f"val/{set_name}/ndcg@10"),
            **{f"dim{d}": val.get(f"val/{set_name}/dim{d}/ndcg@10") for d in dims},
            "trainable": (metrics.get("parameters") or {}).get("trainable"),
            "total": (metrics.get("parameters") or {}).get("total"),
            "samples_per_s": metrics["global_step"] * batch_size / metrics["timing"]["training"],
            "train_s": metrics["timing"].get("training"),
            "peak_rss_train_mb": metrics["peak_rss_mb"].get("training"), "steps": metrics.get("global_step")}


def train_one(variant: str, seed: int, args: argparse.Namespace, data: Path) -> Result:
    return train_recorded(train_command(variant, seed, args, data), run_dir(variant, seed, args),
                          {"variant": variant, "seed": seed}, args,
                          lambda folder: read_figures(folder, (data / "beir").name, args.dim_list, args.batch_size))


def summarize(rows: list[Result], args: argparse.Namespace) -> list[Result]:
    """One row per variant: means over its seeds (NDCG@10 with its std when there are 2+)."""
    table = []
    for variant in args.variant_list:
        runs = [r for r in rows if r["variant"] == variant and r.get("ndcg") is not None]
        if not runs:
            failed = next((r for r in rows if r["variant"] == variant and "error" in r), {"error": "not run"})
            table.append({"variant": variant, "error": failed["error"]})
            continue
        row = {"variant": variant, **mean_std([r["ndcg"] for r in runs])}
        for key in [f"dim{d}" for d in args.dim_list] + ["samples_per_s", "train_s", "peak_rss_train_mb"]:
            values = [r[key] for r in runs if r.get(key) is not None]
            row[key] = sum(values) / len(values) if values else None
        row["trainable"] = runs[0].get("trainable")
        table.append(row)
    return table


def report(rows: list[Result], table: list[Result], args: argparse.Namespace, before: dict | None) -> None:
    untrained = None
    if before:
        dims = ", ".join(f"dim{d} {before[f'dim{d}/ndcg@10']:.4f}" for d in args.dim_list
                         if f"dim{d}/ndcg@10" in before)
        untrained = f"NDCG@10 {before['ndcg@10']:.4f}" + (f" ({dims})" if dims else "")
    print_report(f"pydocs test queries ({args.max_test}), {args.max_train} training pairs, model={args.model}, batch "
                 f"{args.batch_size}, lr {args.lr} (lora {args.lora_lr}), {length(args)}; seeds {args.seeds}",
                 untrained, harness.table([
                     Column("variant", "variant", numeric=False, key=True), Column("NDCG@10", "mean", ".4f"),
                     Column("± std", "std", ".4f"), Column("seeds", "n", "d"),
                     *[Column(f"@{d} dims", f"dim{d}", ".4f") for d in args.dim_list],
                     Column("trainable params", "trainable", ",d"), Column("samples/s", "samples_per_s", ".1f"),
                     Column("training s", "train_s", ".0f"),
                     Column("peak RSS MB (training)", "peak_rss_train_mb", ".0f")], table), [], rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser, workdir="/tmp/gte_pro_bench_options", variants=VARIANTS)
    parser.add_argument("--dims", default="256,128,64", help="truncated widths evaluated (and trained by matryoshka)")
    parser.add_argument("--lora-lr", default="2e-4")
    parser.set_defaults(seeds="1")
    args = finish_arguments(parser, parser.parse_args(argv), VARIANTS)
    args.dim_list = harness.int_list(args.dims)
    if "matryoshka" in args.variant_list and args.model not in WIDTH:
        parser.error(f"--variants matryoshka: the embedding width of --model {args.model} is not known here; "
                     f"known: {', '.join(WIDTH)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    data = pydocs_set(args)
    truncate = (f"eval.truncate_dims=[{','.join(map(str, args.dim_list))}]",)
    commands = [untrained_command(args, data, truncate)] + [
        train_command(v, s, args, data) for s in args.seed_list for v in args.variant_list]
    if not announce(commands, args):
        return
    before = untrained_metrics(args, data, truncate)
    rows = [train_one(v, s, args, data) for s in args.seed_list for v in args.variant_list]
    table = summarize(rows, args)
    report(rows, table, args, before)
    save(args, commands, runs=rows, table=table)


if __name__ == "__main__":
    main()
