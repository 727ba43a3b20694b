"""Peak memory and throughput of the cached contrastive loss (``loss.mini_batch_size``, GradCache) vs uncached steps.

Every configuration runs in a fresh subprocess, so that no configuration's memory hides in another's. Each runs
``--steps`` training steps on distinct batches of demo-corpus (query, positive) pairs: all-MiniLM-L6-v2 (the
packaged real weights, dropout on as in training), truncation at ``--max-length`` tokens, InfoNCE, AdamW.

Before the measured steps, one warm-up step on 8 pairs allocates AdamW's state and initialises the kernels (a
first step is several seconds slower, which would swamp the small batch's timing).

* peak memory: on CPU, the peak resident set size during the steps (VmHWM, reset right before them) minus the
  resident size before them (model and AdamW state allocated, batches tokenized): activations, gradients and
  temporaries, plus what the allocator keeps. On CUDA, ``torch.cuda.max_memory_allocated`` minus the allocation
  before the steps.
* throughput: query-positive pairs per second (wall clock). On CPU the process's CPU time per pair is reported
  too, and the cost ratios use it: wall time on a shared machine also measures the neighbours' load.

Configurations: uncached and cached at the small batch (the pure overhead of caching: one more forward per text),
at ``--cost-batch`` (a batch that still fits uncached), and at the large batch. The uncached large batch is skipped
when its predicted memory (gradients, plus the small batch's activations scaled by the batch ratio) exceeds
``--max-memory-gb`` (default: 70% of the available memory); a cached run is then compared with the uncached run of
the lowest cost per pair. On CPU, large uncached batches are memory-bound and cost more per pair than small ones.

    make bench-gradcache        # ~3 min on 2 idle CPU cores
    .venv/bin/python benchmarks/bench_gradcache.py --device cuda --bf16 --large-batch 4096
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import torch
from harness import Column, Result

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_loss
from gte_pro.data.collate import PairCollator
from gte_pro.models.encoder import Encoder
from gte_pro.training.gradcache import cached_step
from gte_pro.training.losses import InfoNCELoss

MB = harness.MB


def demo_pairs(count: int, cache_dir: str) -> list[tuple[str, str, list[str]]]:
    rows = [(ex.query, ex.positives[0], []) for ex in harness.demo_splits(cache_dir).train]
    if len(rows) < count:
        raise SystemExit(f"the demo corpus has {len(rows)} training pairs; {count} needed: use fewer --steps")
    return rows[:count]


def batches_on(device: torch.device, collate: PairCollator, rows: list, batch_size: int, steps: int) -> list[dict]:
    """``steps`` batches, tokenized and moved up front: tokenization is not what is measured."""
    batches = []
    for step in range(steps):
        batch = collate(rows[step * batch_size : (step + 1) * batch_size])
        batch["query"] = {k: v.to(device) for k, v in batch["query"].items()}
        batch["doc"] = {k: v.to(device) for k, v in batch["doc"].items()}
        batches.append(batch)
    return batches


def warm_up(encoder: Encoder, loss_fn: InfoNCELoss, optimizer: Any, collate: PairCollator, rows: list) -> None:
    """One step on 8 pairs: AdamW's state is allocated and the kernels initialised before anything is measured."""
    batch = collate(rows[:8])
    device = next(encoder.parameters()).device
    loss_fn(encoder(**{k: v.to(device) for k, v in batch["query"].items()}),
            encoder(**{k: v.to(device) for k, v in batch["doc"].items()})).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del batch
    gc.collect()


def step(encoder: Encoder, loss_fn: InfoNCELoss, optimizer: Any, batch: dict, mini_batch_size: int | None,
         bf16: bool) -> float:
    """One training step, cached (GradCache) or uncached as ContrastiveModule does it; its loss."""
    device_type = next(encoder.parameters()).device.type
    optimizer.zero_grad(set_to_none=True)
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):
        if mini_batch_size:
            loss = cached_step(encoder, loss_fn, batch["query"], batch["doc"], 0, mini_batch_size).loss
        else:
            query, docs = encoder(**batch["query"]), encoder(**batch["doc"])
            loss = loss_fn(query, docs).loss
            loss.backward()
    optimizer.step()
    return float(loss.detach())


def measure_config(payload: dict[str, Any]) -> Result:
    """One configuration (``batch_size``, ``mini_batch_size``, ``steps``, ...), in a fresh process."""
    batch_size, mini_batch_size, steps = payload["batch_size"], payload["mini_batch_size"], payload["steps"]
    device = torch.device(payload["device"])
    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), max_length=payload["max_length"], length_chunks=1).to(device)
    loss_fn = default_loss("infonce", temperature=0.05)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-5)
    collate = PairCollator(encoder.tokenizer, payload["max_length"])
    rows = demo_pairs(batch_size * steps, payload["cache_dir"])
    batches = batches_on(device, collate, rows, batch_size, steps)
    warm_up(encoder, loss_fn, optimizer, collate, rows)
    memory = harness.PeakMemory(device.type)
    memory.start()
    times, cpu_times, losses = [], [], []
    for batch in batches:
        with harness.timed() as timing:
            losses.append(step(encoder, loss_fn, optimizer, batch, mini_batch_size, payload["bf16"]))
        times.append(timing.wall_s)
        cpu_times.append(timing.cpu_s)
    delta, absolute = memory.peak()
    # gradients (4 bytes per parameter): the measured memory that does not grow with the batch
    fixed = 4 * sum(p.numel() for p in encoder.parameters())
    return {"batch_size": batch_size, "mini_batch_size": mini_batch_size, "device": device.type,
            "peak_delta_mb": delta / MB, "fixed_mb": fixed / MB, "peak_total_mb": absolute / MB,
            "s_per_step": statistics.mean(times), "samples_per_s": batch_size / statistics.mean(times),
            "steps": steps, "losses": losses,
            # all threads' CPU time; on CUDA the wall time is the cost (the CPU mostly waits)
            "cost_per_pair_ms": 1000 * statistics.mean(cpu_times if device.type == "cpu" else times) / batch_size,
            "doc_tokens": int(sum(b["doc"]["attention_mask"].shape[1] for b in batches) / steps)}


def spawn(args: argparse.Namespace, work: Path, batch_size: int, mini_batch_size: int | None, steps: int) -> Result:
    """One configuration in its own process: no configuration's memory hides in another's."""
    payload = {"batch_size": batch_size, "mini_batch_size": mini_batch_size, "steps": steps,
               "max_length": args.max_length, "device": args.device, "bf16": args.bf16, "cache_dir": args.cache_dir}
    result = harness.run_child(measure_config, payload, work, args.timeout)
    label = "cached" if mini_batch_size else "uncached"
    print(f"batch {batch_size} {label}: " + (f"FAILED: {result['error']}" if "error" in result else
                                             f"{result['samples_per_s']:.1f} pairs/s"), file=sys.stderr, flush=True)
    return {"batch_size": batch_size, "mini_batch_size": mini_batch_size, **result}


def available_memory_gb(device: str) -> float:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return free / 2**30
    return harness.proc_kb("MemAvailable", "/proc/meminfo") / 2**20


def configurations(args: argparse.Namespace, work: Path) -> list[Result]:
    """Small batch uncached and cached; then the large batch (uncached only where its predicted memory fits,
    else both at ``--cost-batch``), cached."""
    limit = args.max_memory_gb or 0.7 * available_memory_gb(args.device)
    small = spawn(args, work, args.small_batch, None, args.small_steps)
    if "error" in small:
        raise SystemExit(f"batch {args.small_batch} failed: {small['error']}")
    # the pure overhead of caching (one more forward per text), at a batch where the uncached step is efficient
    results = [small, spawn(args, work, args.small_batch, args.mini_batch_size, args.small_steps)]
    # activations grow with the batch; gradients do not
    activations = max(small["peak_delta_mb"] - small["fixed_mb"], 0.0)
    predicted_gb = (small["fixed_mb"] + activations * args.large_batch / args.small_batch) / 1024
    if args.uncached_large == "never" or (args.uncached_large == "auto" and predicted_gb > limit):
        large = {"batch_size": args.large_batch, "mini_batch_size": None,
                 "skipped": f"not run: predicted {predicted_gb:.1f} GB (limit {limit:.1f} GB)"}
        if args.cost_batch:  # the cost of caching at a batch that fits uncached
            results += [spawn(args, work, args.cost_batch, None, args.steps),
                        spawn(args, work, args.cost_batch, args.mini_batch_size, args.steps)]
    else:
        large = spawn(args, work, args.large_batch, None, args.steps)
    return results + [large, spawn(args, work, args.large_batch, args.mini_batch_size, args.steps)]


def cost_vs_uncached(results: list[Result]) -> None:
    """A cached run's cost against the uncached run of the same batch or, when that did not run, against the
    uncached run with the lowest cost per pair (named): the conservative comparison. Stored as ``cost``."""
    uncached = {r["batch_size"]: r for r in results if not r.get("mini_batch_size") and "cost_per_pair_ms" in r}
    for r in results:
        if r.get("mini_batch_size") and uncached and "cost_per_pair_ms" in r:
            base = uncached.get(r["batch_size"]) or min(uncached.values(), key=lambda u: u["cost_per_pair_ms"])
            same = "" if base["batch_size"] == r["batch_size"] else f" (vs batch {base['batch_size']})"
            r["cost"] = f"{r['cost_per_pair_ms'] / base['cost_per_pair_ms']:.2f}x{same}"


def table(results: list[Result]) -> str:
    small = results[0]
    unit = "CPU ms/pair" if small.get("device", "cpu") == "cpu" else "ms/pair"
    cost_vs_uncached(results)
    return harness.table([
        Column("configuration", lambda r: f"cached, mini_batch_size={r['mini_batch_size']}"
               if r.get("mini_batch_size") else "uncached", numeric=False, key=True),
        Column("contrastive batch", "batch_size", key=True),
        Column("peak memory above model+AdamW (MB)", "peak_delta_mb", ".0f"),
        Column(f"vs uncached batch {small['batch_size']}",
               lambda r: harness.ratio(r["peak_delta_mb"], small["peak_delta_mb"])),
        Column("pairs/s (wall)", "samples_per_s", ".1f"), Column(unit, "cost_per_pair_ms", ".0f"),
        Column("cost vs uncached", "cost"), Column("s/step", "s_per_step", ".1f")], results)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), max_length=64, timeout_of="configuration", cache_dir=True,
                                json="write every configuration's raw result to this file")
    parser.add_argument("--small-batch", type=int, default=32)
    parser.add_argument("--large-batch", type=int, default=1024)
    parser.add_argument("--mini-batch-size", type=int, default=32)
    parser.add_argument("--cost-batch", type=int, default=128,
                        help="when the uncached large batch does not run: measure the cached loss's cost against "
                             "an uncached run at this batch instead (0: skip)")
    parser.add_argument("--steps", type=int, default=1, help="measured steps of each larger configuration")
    parser.add_argument("--small-steps", type=int, default=3)
    parser.add_argument("--uncached-large", choices=["auto", "always", "never"], default="auto",
                        help="auto: run the uncached large batch only if its predicted memory fits")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the encoder; the loss stays fp32)")
    parser.add_argument("--max-memory-gb", type=float, default=None)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_gradcache_") as tmp:
        results = configurations(args, Path(tmp))
    print(f"all-MiniLM-L6-v2, demo-corpus pairs (in-batch negatives), max_length {args.max_length}, "
          f"{args.device}{' bf16 autocast' if args.bf16 else ' fp32'}; measured steps: {args.small_steps} (batch "
          f"{args.small_batch}), {args.steps} (larger) after a warm-up step; "
          f"{time.perf_counter() - started:.0f} s in all\n{harness.machine()}\n")
    print(table(results), end="")
    print("\nlosses per step (same batches; dropout on, so cached and uncached differ slightly):")
    for r in results:
        print(f"  batch {r['batch_size']} mini_batch_size={r.get('mini_batch_size')}: {r.get('losses')}")
    harness.save(args, results=results)


if __name__ == "__main__":
    main()
