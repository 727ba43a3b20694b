"""Memory and start-up against the number of training pairs: 10k vs 200k synthetic pairs through ``train.py``.

For each size it writes a synthetic JSON-lines file (short queries, passages of ~50-250 tokens), then runs
``python train.py data=jsonl ...`` twice in fresh processes with the same token-cache folder: ``cold`` builds the
token cache (streams, cleans and tokenizes the file), ``warm`` starts from it. Every run trains the same number of
steps on the same 200-query validation file, so only the number of training pairs differs. Reported per run: peak
RSS of the process (``wait4``), wall time, and the data start-up time (data module ``prepare_data`` + ``setup``,
timed in a separate fresh process). A run that fails is reported with its reason; the others go on. Usage::

    python benchmarks/bench_scale.py [--sizes 10000,200000] [--steps 30] [--workdir /tmp/gte_pro_bench_scale]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import Column, Result

from gte_pro.modes.build_data import data_module

VAL_ROWS = 200
PHASES = ("cold", "warm")


def write_pairs(path: Path, count: int, seed: int) -> None:
    """``count`` rows: a 4-12 word query that shares a few words with its 40-200 word passage."""
    rng = random.Random(seed)
    vocabulary = harness.words(rng, 20_000)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as handle:
        for _ in range(count):
            passage = rng.choices(vocabulary, k=rng.randint(40, 200))
            query = rng.sample(passage, 3) + rng.choices(vocabulary, k=rng.randint(1, 9))
            handle.write(json.dumps({"query": " ".join(query), "positive": " ".join(passage)}) + "\n")
    tmp.replace(path)


def setup_child(payload: dict[str, Any]) -> Result:
    """Time the data module's start-up alone (tokenizer load excluded), in a fresh process."""
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    start = time.perf_counter()
    module = data_module("jsonl", train_file=payload["train"], val_file=payload["val"], tokenizer=tokenizer,
                         cache_dir=payload["cache"], max_length=payload["max_length"])
    module.prepare_data()
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    seconds = time.perf_counter() - start
    return {"setup_s": seconds, "rows": len(module.train_rows), "batch": list(batch["doc"]["input_ids"].shape),
            **_collation_ms(module)}


def _collation_ms(module: Any, batches: int = 50) -> dict[str, float]:
    """Per-batch cost of making the input tensors: tokenizing the texts each step (what the training loop did
    before the token cache) vs padding cached ids (now), on the same batches."""
    from gte_pro.data.collate import PairCollator, TokenCollator

    size = module.batch_size
    rows = [module.train_rows[i] for i in range(batches * size)]
    texts = [(ex.query, ex.positives[0], []) for ex in rows]
    pairs = module.train_dataloader().dataset
    to_text = PairCollator(module.tokenizer, module.max_length)
    to_ids = TokenCollator(module.tokenizer)
    with harness.timed() as tokenizing:
        for b in range(batches):
            to_text(texts[b * size : (b + 1) * size])
    with harness.timed() as padding:
        for b in range(batches):
            to_ids(pairs.__getitems__(list(range(b * size, (b + 1) * size))))  # includes the memory-mapped read
    return {"tokenize_ms": tokenizing.wall_s / batches * 1000, "cached_ms": padding.wall_s / batches * 1000}


def train_run(size: int, phase: str, train: Path, val: Path, cache: Path, args: argparse.Namespace) -> Result:
    """``train.py`` on ``train`` in a fresh process: wall time and peak RSS (or the failure)."""
    work = Path(args.workdir)
    run_dir = work / f"run_{size}_{phase}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = harness.train_command(
        "data=jsonl", f"data.train_file={train}", f"data.val_file={val}", f"data.max_length={args.max_length}",
        f"trainer.max_steps={args.steps}", f"paths.cache_dir={cache}", f"hydra.run.dir={run_dir}", "logger=csv",
        "callbacks.progress_bar=null", "export.hf=false")
    result = harness.run_train(cmd, work / f"log_{size}_{phase}.txt", args.timeout)
    line = (f"FAILED: {result['error']}" if "error" in result else
            f"{result['wall_s']:.0f} s, peak RSS {result['peak_rss_mb']:.0f} MB")
    print(f"{size} pairs, {phase}: {line}", file=sys.stderr, flush=True)
    return {"pairs": size, "phase": phase, **result}


def measure(size: int, args: argparse.Namespace, val: Path) -> list[Result]:
    """Cold and warm training runs of one size, then the data start-up alone: one result per phase."""
    work = Path(args.workdir)
    train = work / f"pairs_{size}.jsonl"
    if not train.exists():
        write_pairs(train, size, seed=size)
    cache = work / f"cache_{size}"
    shutil.rmtree(cache, ignore_errors=True)
    rows = [train_run(size, phase, train, val, cache, args) for phase in PHASES]
    payload = {"train": str(train), "val": str(val), "cache": str(cache), "max_length": args.max_length}
    setup = harness.run_child(setup_child, payload, work, args.timeout)
    rows.append({"pairs": size, "phase": "setup", **setup,
                 "cache_mb": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20,
                 "file_mb": train.stat().st_size / 2**20})
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), max_length=256, workdir="/tmp/gte_pro_bench_scale")
    parser.add_argument("--sizes", default="10000,200000")
    parser.add_argument("--steps", type=int, default=30)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    harness.announce()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    val = Path(args.workdir) / "val.jsonl"
    write_pairs(val, VAL_ROWS, seed=-1)
    rows = [row for size in harness.int_list(args.sizes) for row in measure(size, args, val)]
    report(rows, args)
    harness.save(args, results=rows)


def by_size(rows: list[Result]) -> dict[int, Result]:
    """One table row per size: the phases' figures side by side (``cold_wall_s``, ..., ``setup_s``)."""
    merged: dict[int, Result] = {}
    for row in rows:
        into = merged.setdefault(row["pairs"], {"pairs": row["pairs"]})
        if row["phase"] not in PHASES:  # the setup row: file and cache sizes even when the start-up failed
            into.update({k: v for k, v in row.items() if k not in ("error", "log_tail")})
        elif "error" not in row:
            into.update({f"{row['phase']}_{k}": row[k] for k in ("wall_s", "peak_rss_mb")})
    return merged


def report(rows: list[Result], args: argparse.Namespace) -> None:
    print(f"\ntrain.py, data=jsonl, {args.steps} steps of batch 32, max_length {args.max_length}, "
          f"{VAL_ROWS}-query validation file, packaged MiniLM\n{harness.machine()}\n")
    sizes = by_size(rows)
    print(harness.table([
        Column("training pairs", lambda r: f"{r['pairs']:,}", key=True), Column("file MB", "file_mb", ".0f"),
        Column("token cache MB", "cache_mb", ".0f"), Column("cold: wall s", "cold_wall_s", ".0f"),
        Column("cold: peak RSS MB", "cold_peak_rss_mb", ".0f"), Column("warm: wall s", "warm_wall_s", ".0f"),
        Column("warm: peak RSS MB", "warm_peak_rss_mb", ".0f"),
        Column("data start-up from cache s", "setup_s", ".1f")], list(sizes.values())), end="")
    for row in rows:
        if "error" in row:
            print(f"\nFAILED: {row['pairs']:,} pairs, {row['phase']}: {row['error']}")
    small, large = sizes[min(sizes)], sizes[max(sizes)]
    for key in (f"{phase}_peak_rss_mb" for phase in PHASES if len(sizes) > 1):
        if large.get(key) and small.get(key):
            ratio = large[key] / small[key]
            print(f"\npeak RSS {key.split('_')[0]}, {max(sizes):,} vs {min(sizes):,} pairs: {ratio:.3f}x "
                  f"({(ratio - 1) * 100:+.1f}%)")
    if "tokenize_ms" in large:
        print(f"\ninput tensors per batch of 32 pairs: tokenizing the texts {large['tokenize_ms']:.1f} ms, "
              f"padding cached ids {large['cached_ms']:.1f} ms (incl. the memory-mapped read)")


if __name__ == "__main__":
    main()
