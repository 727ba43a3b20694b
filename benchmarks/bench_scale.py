"""Memory and start-up against the number of training pairs: 10k vs 200k synthetic pairs through ``train.py``.

For each size it writes a synthetic JSON-lines file (short queries, passages of ~50-250 tokens), then runs
``python train.py data=jsonl ...`` twice in fresh processes with the same token-cache folder: ``cold`` builds the
token cache (streams, cleans and tokenizes the file), ``warm`` starts from it. Every run trains the same number of
steps on the same 200-query validation file, so only the number of training pairs differs. Reported per run: peak
RSS of the process (``wait4``), wall time, and the data start-up time (data module ``prepare_data`` + ``setup``,
timed in a separate fresh process). Usage::

    python benchmarks/bench_scale.py [--sizes 10000,200000] [--steps 30] [--workdir /tmp/gte_pro_bench_scale]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
VAL_ROWS = 200


def _words(rng: random.Random, count: int) -> list[str]:
    syllables = ["ka", "lo", "mi", "ren", "tu", "sa", "vor", "el", "di", "an", "po", "ix", "ne", "ul", "ter", "gra"]
    return ["".join(rng.choices(syllables, k=rng.randint(1, 4))) for _ in range(count)]


def write_pairs(path: Path, count: int, seed: int) -> None:
    """``count`` rows: a 4-12 word query that shares a few words with its 40-200 word passage."""
    rng = random.Random(seed)
    vocabulary = _words(rng, 20_000)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as handle:
        for _ in range(count):
            passage = rng.choices(vocabulary, k=rng.randint(40, 200))
            query = rng.sample(passage, 3) + rng.choices(vocabulary, k=rng.randint(1, 9))
            handle.write(json.dumps({"query": " ".join(query), "positive": " ".join(passage)}) + "\n")
    tmp.replace(path)


def _run(cmd: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, which must succeed."""
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    code = os.waitstatus_to_exitcode(status)
    if code:
        sys.exit(f"failed ({code}): {' '.join(cmd)}\n{log.read_text()[-3000:]}")
    return seconds, usage.ru_maxrss / 1024


def setup_worker(train_file: str, val_file: str, cache_dir: str, max_length: int) -> None:
    """Time the data module's start-up alone (tokenizer load excluded) and print it."""
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path
    from gte_pro.data import JsonlDataModule

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    start = time.perf_counter()
    module = JsonlDataModule(train_file=train_file, val_file=val_file, tokenizer=tokenizer, cache_dir=cache_dir,
                             max_length=max_length)
    module.prepare_data()
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    seconds = time.perf_counter() - start
    print("SETUP " + json.dumps({"seconds": seconds, "rows": len(module.train_rows),
                                 "batch": list(batch["doc"]["input_ids"].shape), **_collation_ms(module)}))


def _collation_ms(module, batches: int = 50) -> dict[str, float]:
    """Per-batch cost of making the input tensors: tokenizing the texts each step (what the training loop did
    before the token cache) vs padding cached ids (now), on the same batches."""
    from gte_pro.data.datamodule import PairCollator, TokenCollator

    size = module.batch_size
    rows = [module.train_rows[i] for i in range(batches * size)]
    texts = [(ex.query, ex.positives[0], []) for ex in rows]
    pairs = module.train_dataloader().dataset
    to_text = PairCollator(module.tokenizer, module.max_length)
    to_ids = TokenCollator(module.tokenizer)
    start = time.perf_counter()
    for b in range(batches):
        to_text(texts[b * size : (b + 1) * size])
    text_ms = (time.perf_counter() - start) / batches * 1000
    start = time.perf_counter()
    for b in range(batches):
        to_ids(pairs.__getitems__(list(range(b * size, (b + 1) * size))))  # includes the memory-mapped read
    return {"tokenize_ms": text_ms, "cached_ms": (time.perf_counter() - start) / batches * 1000}


def _setup(train: Path, val: Path, cache: Path, args: argparse.Namespace, env: dict[str, str]) -> dict:
    cmd = [sys.executable, __file__, "--setup-worker", str(train), str(val), str(cache), str(args.max_length)]
    out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(next(ln for ln in out.splitlines() if ln.startswith("SETUP "))[6:])


def measure(size: int, args: argparse.Namespace, val: Path, env: dict[str, str]) -> list[dict]:
    work = Path(args.workdir)
    train = work / f"pairs_{size}.jsonl"
    if not train.exists():
        write_pairs(train, size, seed=size)
    cache = work / f"cache_{size}"
    shutil.rmtree(cache, ignore_errors=True)
    rows = []
    for phase in ("cold", "warm"):
        run_dir = work / f"run_{size}_{phase}"
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = [sys.executable, "train.py", "data=jsonl", f"data.train_file={train}", f"data.val_file={val}",
               f"data.max_length={args.max_length}", f"trainer.max_steps={args.steps}", f"paths.cache_dir={cache}",
               f"hydra.run.dir={run_dir}", "logger=csv", "callbacks.progress_bar=null", "export.hf=false"]
        seconds, rss = _run(cmd, env, work / f"log_{size}_{phase}.txt")
        rows.append({"pairs": size, "phase": phase, "wall_s": seconds, "peak_rss_mb": rss})
        print(f"{size} pairs, {phase}: {seconds:.0f} s, peak RSS {rss:.0f} MB", file=sys.stderr)
    setup = _setup(train, val, cache, args, env)
    rows.append({"pairs": size, "phase": "setup", "setup_s": setup["seconds"], "tokenize_ms": setup["tokenize_ms"],
                 "cached_ms": setup["cached_ms"],
                 "cache_mb": sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20,
                 "file_mb": train.stat().st_size / 2**20})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="10000,200000")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--workdir", default="/tmp/gte_pro_bench_scale")
    parser.add_argument("--setup-worker", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.setup_worker:
        train, val, cache, max_length = args.setup_worker
        setup_worker(train, val, cache, int(max_length))
        return
    print("command: " + " ".join([Path(sys.executable).name, *sys.argv]))
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    val = Path(args.workdir) / "val.jsonl"
    write_pairs(val, VAL_ROWS, seed=-1)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline"}
    rows = [row for size in map(int, args.sizes.split(",")) for row in measure(size, args, val, env)]
    _print_table(rows, args)


def _print_table(rows: list[dict], args: argparse.Namespace) -> None:
    print(f"\ntrain.py, data=jsonl, {args.steps} steps of batch 32, max_length {args.max_length}, "
          f"{VAL_ROWS}-query validation file, packaged MiniLM\n")
    print("| training pairs | file MB | token cache MB | cold: wall s | cold: peak RSS MB | warm: wall s | "
          "warm: peak RSS MB | data start-up from cache s |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    by_size: dict[int, dict[str, dict]] = {}
    for row in rows:
        by_size.setdefault(row["pairs"], {})[row["phase"]] = row
    for size, phases in by_size.items():
        cold, warm, setup = phases["cold"], phases["warm"], phases["setup"]
        print(f"| {size:,} | {setup['file_mb']:.0f} | {setup['cache_mb']:.0f} | {cold['wall_s']:.0f} | "
              f"{cold['peak_rss_mb']:.0f} | {warm['wall_s']:.0f} | {warm['peak_rss_mb']:.0f} | "
              f"{setup['setup_s']:.1f} |")
    sizes = sorted(by_size)
    if len(sizes) > 1:
        small, large = by_size[sizes[0]], by_size[sizes[-1]]
        for phase in ("cold", "warm"):
            ratio = large[phase]["peak_rss_mb"] / small[phase]["peak_rss_mb"]
            print(f"\npeak RSS {phase}, {sizes[-1]:,} vs {sizes[0]:,} pairs: {ratio:.3f}x ({(ratio - 1) * 100:+.1f}%)")
    last = by_size[sizes[-1]]["setup"]
    print(f"\ninput tensors per batch of 32 pairs: tokenizing the texts {last['tokenize_ms']:.1f} ms, "
          f"padding cached ids {last['cached_ms']:.1f} ms (incl. the memory-mapped read)")


if __name__ == "__main__":
    main()
