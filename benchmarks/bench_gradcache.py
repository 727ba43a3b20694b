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
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from gte_pro import packaged_minilm_path
from gte_pro.data.datamodule import PairCollator
from gte_pro.data.demo import load_demo_splits
from gte_pro.gradcache import cached_step
from gte_pro.losses import InfoNCELoss
from gte_pro.model import Encoder

MB = 2**20


def _proc_status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


class PeakMemory:
    """Peak memory of a code region, above what was in use when it started (bytes)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device

    def start(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return
        self.base = _proc_status_kb("VmRSS") * 1024
        # "5" resets the peak RSS (VmHWM) to the current RSS: the peak of the steps alone, not of model loading
        Path("/proc/self/clear_refs").write_text("5")

    def peak(self) -> tuple[int, int]:
        """(peak above the start, absolute peak)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated(self.device)
        else:
            peak = _proc_status_kb("VmHWM") * 1024
        return peak - self.base, peak


def demo_pairs(count: int, cache_dir: str) -> list[tuple[str, str, list[str]]]:
    splits = load_demo_splits(cache_dir, val_fraction=0.1, min_query_chars=10, min_doc_chars=40, max_distractors=1000)
    rows = [(ex.query, ex.positives[0], []) for ex in splits.train]
    if len(rows) < count:
        raise SystemExit(f"the demo corpus has {len(rows)} training pairs; {count} needed: use fewer --steps")
    return rows[:count]


def run_one(batch_size: int, mini_batch_size: int | None, steps: int, max_length: int, device_name: str,
            bf16: bool, cache_dir: str) -> dict[str, Any]:
    """One configuration, in this (fresh) process."""
    device = torch.device(device_name)
    torch.manual_seed(0)
    encoder = Encoder(packaged_minilm_path(), max_length=max_length).to(device)
    loss_fn = InfoNCELoss(temperature=0.05)
    optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-5)
    collate = PairCollator(encoder.tokenizer, max_length)
    rows = demo_pairs(batch_size * steps, cache_dir)
    batches = []
    for step in range(steps):  # tokenized up front: tokenization is not what is measured
        batch = collate(rows[step * batch_size : (step + 1) * batch_size])
        batch["query"] = {k: v.to(device) for k, v in batch["query"].items()}
        batch["doc"] = {k: v.to(device) for k, v in batch["doc"].items()}
        batches.append(batch)
    warm_up = collate(rows[:8])
    loss_fn(encoder(**{k: v.to(device) for k, v in warm_up["query"].items()}),
            encoder(**{k: v.to(device) for k, v in warm_up["doc"].items()})).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    del warm_up
    gc.collect()
    memory = PeakMemory(device)
    memory.start()
    times, cpu_times, losses = [], [], []
    for batch in batches:
        start, cpu_start = time.perf_counter(), time.process_time()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            if mini_batch_size:
                loss = cached_step(encoder, loss_fn, batch["query"], batch["doc"], 0, mini_batch_size).loss
            else:  # ContrastiveModule's uncached step
                query, docs = encoder(**batch["query"]), encoder(**batch["doc"])
                loss = loss_fn(query, docs).loss
                loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))  # a host sync: the step is finished when its time is taken
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    delta, absolute = memory.peak()
    timed, cpu_timed = times, cpu_times
    # gradients (4 bytes per parameter): the measured memory that does not grow with the batch
    fixed = 4 * sum(p.numel() for p in encoder.parameters())
    return {"batch_size": batch_size, "mini_batch_size": mini_batch_size, "device": device.type,
            "peak_delta_mb": delta / MB,
            "fixed_mb": fixed / MB,
            "peak_total_mb": absolute / MB, "s_per_step": statistics.mean(timed),
            "samples_per_s": batch_size / statistics.mean(timed), "steps": steps, "losses": losses,
            # all threads' CPU time; on CUDA the wall time is the cost (the CPU mostly waits)
            "cost_per_pair_ms": 1000 * statistics.mean(cpu_timed if device.type == "cpu" else timed) / batch_size,
            "doc_tokens": int(sum(b["doc"]["attention_mask"].shape[1] for b in batches) / steps)}


def spawn(args: argparse.Namespace, batch_size: int, mini_batch_size: int | None, steps: int) -> dict[str, Any]:
    command = [sys.executable, __file__, "--child", json.dumps([batch_size, mini_batch_size, steps]),
               "--max-length", str(args.max_length), "--device", args.device, "--cache-dir", args.cache_dir]
    if args.bf16:
        command.append("--bf16")
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        return {"batch_size": batch_size, "mini_batch_size": mini_batch_size,
                "error": f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1:] or ''}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def available_memory_gb(device: str) -> float:
    if device.startswith("cuda"):
        free, _ = torch.cuda.mem_get_info()
        return free / 2**30
    return _proc_status_meminfo("MemAvailable") / 2**20


def _proc_status_meminfo(field: str) -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/meminfo")


def table(results: list[dict[str, Any]]) -> str:
    """One row per configuration; a cached run's cost is against the uncached run of the same batch or, when that
    did not run, against the uncached run with the lowest cost per pair (named): the conservative comparison."""
    small = results[0]
    uncached = {r["batch_size"]: r for r in results if not r.get("mini_batch_size") and "cost_per_pair_ms" in r}
    unit = "CPU ms/pair" if small.get("device", "cpu") == "cpu" else "ms/pair"
    lines = [f"| configuration | contrastive batch | peak memory above model+AdamW (MB) | vs uncached batch "
             f"{small['batch_size']} | pairs/s (wall) | {unit} | cost vs uncached | s/step |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        name = f"cached, mini_batch_size={r['mini_batch_size']}" if r.get("mini_batch_size") else "uncached"
        if "cost_per_pair_ms" not in r:
            lines.append(f"| {name} | {r['batch_size']} | {r.get('error') or r.get('skipped')} | | | | | |")
            continue
        cost = ""
        if r.get("mini_batch_size") and uncached:
            base = uncached.get(r["batch_size"]) or min(uncached.values(), key=lambda u: u["cost_per_pair_ms"])
            same = "" if base["batch_size"] == r["batch_size"] else f" (vs batch {base['batch_size']})"
            cost = f"{r['cost_per_pair_ms'] / base['cost_per_pair_ms']:.2f}x{same}"
        lines.append(f"| {name} | {r['batch_size']} | {r['peak_delta_mb']:.0f} | "
                     f"{r['peak_delta_mb'] / small['peak_delta_mb']:.2f}x | {r['samples_per_s']:.1f} | "
                     f"{r['cost_per_pair_ms']:.0f} | {cost} | {r['s_per_step']:.1f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the encoder; the loss stays fp32)")
    parser.add_argument("--max-memory-gb", type=float, default=None)
    parser.add_argument("--cache-dir", default=os.environ.get("GTE_PRO_CACHE", "~/.cache/gte_pro"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        batch_size, mini_batch_size, steps = json.loads(args.child)
        print(json.dumps(run_one(batch_size, mini_batch_size, steps, args.max_length, args.device, args.bf16,
                                 args.cache_dir)))
        return

    limit = args.max_memory_gb or 0.7 * available_memory_gb(args.device)
    started = time.perf_counter()
    small = spawn(args, args.small_batch, None, args.small_steps)
    if "error" in small:
        raise SystemExit(f"batch {args.small_batch} failed: {small['error']}")
    # the pure overhead of caching (one more forward per text), at a batch where the uncached step is efficient
    results = [small, spawn(args, args.small_batch, args.mini_batch_size, args.small_steps)]
    # activations grow with the batch; gradients do not
    activations = max(small["peak_delta_mb"] - small["fixed_mb"], 0.0)
    predicted_gb = (small["fixed_mb"] + activations * args.large_batch / args.small_batch) / 1024
    if args.uncached_large == "never" or (args.uncached_large == "auto" and predicted_gb > limit):
        large = {"batch_size": args.large_batch, "mini_batch_size": None,
                 "skipped": f"not run: predicted {predicted_gb:.1f} GB (limit {limit:.1f} GB)"}
        if args.cost_batch:  # the cost of caching at a batch that fits uncached
            results += [spawn(args, args.cost_batch, None, args.steps),
                        spawn(args, args.cost_batch, args.mini_batch_size, args.steps)]
    else:
        large = spawn(args, args.large_batch, None, args.steps)
    results += [large, spawn(args, args.large_batch, args.mini_batch_size, args.steps)]
    print(f"all-MiniLM-L6-v2, demo-corpus pairs (in-batch negatives), max_length {args.max_length}, "
          f"{args.device}{' bf16 autocast' if args.bf16 else ' fp32'}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}; measured steps: {args.small_steps} (batch {args.small_batch}), {args.steps} "
          f"(larger) after a warm-up step; {time.perf_counter() - started:.0f} s in all\n")
    print(table(results))
    print("\nlosses per step (same batches; dropout on, so cached and uncached differ slightly):")
    for r in results:
        print(f"  batch {r['batch_size']} mini_batch_size={r.get('mini_batch_size')}: {r.get('losses')}")


if __name__ == "__main__":
    main()
