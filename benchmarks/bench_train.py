"""Training throughput (and, with --eval, quality at equal steps): this project's training path vs a plain PyTorch
loop vs sentence-transformers' trainer vs the seed article's recipe, on the same model, data, batch size, max length,
learning rate, schedule, gradient clipping, seed and number of steps.

Usage::

    python benchmarks/bench_train.py [--batch-size 32] [--max-length 128] [--steps 20] [--rounds 3]
        [--variants ours,plain,st[,seed]] [--precision 32-true|bf16-mixed] [--eval [--eval-queries N]]
        [--pairs-file pairs.jsonl] [--timeout 900] [--json results.json]

    # ablations: extra Hydra overrides for a config-built variant, named in the table by the spec string
    python benchmarks/bench_train.py \
        --variants "ours,plain,ours:model.attn_implementation=eager,ours:optimizer.fused=true"

Variants (spec ``kind[:key=value[:key=value...]]``; overrides apply to ours, plain and seed; values may not contain
``:`` or ``,``):

  ours   the product path: conf/train.yaml composed with Hydra (as ``python train.py`` does; logger=none,
         callbacks=none, no checkpointing, validation or export), gte_pro.modes.build, ``trainer.fit``
  plain  a hand-written PyTorch loop over exactly the same batches (same composed config, same seed, the data
         module's own train_dataloader), same encoder, loss, AdamW parameter groups, schedule and clipping; no
         Lightning: the framework-overhead floor
  st     sentence-transformers' SentenceTransformerTrainer + MultipleNegativesRankingLoss on the same pairs, with
         its own seeded random sampler (as its users run it)
  seed   the seed article's recipe: every text padded to 512 tokens, CLS pooling + a linear projection head

Each measurement runs in a fresh subprocess (peak RSS is per variant); rounds are interleaved (A B C D, A B C D, ...)
and medians are reported (all three by ``benchmarks/harness``). The first ``WARMUP_STEPS`` steps are trained but
not timed. A variant that fails (an exception, a non-zero exit, the OOM killer, ``--timeout``) is recorded with its
reason and the other variants go on.

With ``--eval`` each trained model is saved in sentence-transformers layout and scored by one evaluator, in its own
subprocess: ``gte_pro.models.encoder.Encoder.load(folder)`` embeds the held-out validation set of the composed data
config (the demo corpus by default) and ``gte_pro.evaluation.metrics.evaluate_embeddings`` computes NDCG@10 and
Recall@10. The untrained model is scored once for reference. The seed recipe's projection head has no
sentence-transformers form: it is not scored.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import harness
from harness import Column, Result
from train_common import WARMUP_STEPS, Variant, parse_variants
from train_runs import score_child, train_child

METRICS = ("ndcg@10", "recall@10")
MEDIANS = ("samples_per_s", "real_tokens_per_s", "padding_fraction", "gflops", "peak_rss_mb", "peak_gpu_mb", *METRICS)
Runs = dict[str, list[Result]]  # variant spec -> one result per round


# --- the parent: what one round of a variant is, the table, the footnotes ---------------------------------------------
def child_options(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    keys = ("batch_size", "max_length", "steps", "seed", "precision", "threads", "pairs", "pairs_file",
            "eval_queries")
    return {**{k: getattr(args, k) for k in keys}, "work_dir": str(work)}


def measure(args: argparse.Namespace, variant: Variant, round_no: int, work: Path) -> Result:
    """One training run of ``variant``, then (with --eval) its score; the model folder is removed afterwards."""
    save_dir = work / f"model_{round_no}_{hashlib.sha1(variant.spec.encode()).hexdigest()[:8]}"
    scored = args.eval and variant.kind != "seed"
    opts = {**child_options(args, work), "spec": variant.spec, "save_dir": str(save_dir) if scored else None}
    result = harness.run_child(train_child, opts, work, args.timeout)
    if scored and "error" not in result:
        result["score"] = harness.run_child(score_child, {**child_options(args, work), "model_dir": str(save_dir)},
                                            work, args.timeout)
    shutil.rmtree(save_dir, ignore_errors=True)
    return result


def describe(result: Result) -> str:
    """The progress line of a successful round."""
    line = f"{result['samples_per_s']:.2f} samples/s"
    score = result.get("score") or {}
    line += f", ndcg@10 {score['ndcg@10']:.4f}" if "ndcg@10" in score else ""
    return line + (f", scoring FAILED: {score['error']}" if "error" in score else "")


def scores_flat(results: Sequence[Result]) -> list[Result]:
    """Each round's result with its quality figures (from its scoring child) beside its throughput figures."""
    return [{**r, **{k: v for k, v in (r.get("score") or {}).items() if k in METRICS}} for r in results]


def medians(results: Sequence[Result]) -> Result | None:
    """Medians over the successful rounds (None when every round failed); quality over the scored rounds."""
    return harness.medians(scores_flat(results), MEDIANS)


def columns(med: Mapping[str, Result | None], gpu: bool, eval_on: bool) -> list[Column]:
    speed = {kind: (med.get(kind) or {}).get("samples_per_s") for kind in ("st", "plain")}
    cols = [Column("variant", "variant", numeric=False, key=True), Column("samples/s", "samples_per_s", ".2f"),
            Column("vs st", lambda r: harness.ratio(r.get("samples_per_s"), speed["st"])),
            Column("vs plain", lambda r: harness.ratio(r.get("samples_per_s"), speed["plain"])),
            Column("real tokens/s", "real_tokens_per_s", ".0f"), Column("padding", "padding_fraction", ".2f"),
            Column("GFLOP/s", "gflops", ".1f"), Column("peak RSS MB", "peak_rss_mb", ".0f")]
    cols += [Column("peak GPU MB", "peak_gpu_mb", ".0f")] * gpu
    # the seed recipe's head is not exportable, hence never scored: n/a rather than a missing score
    return cols + [Column(m, lambda r, m=m: r.get(m, "n/a" if r["variant"].split(":")[0] == "seed" else None),
                          ".4f") for m in METRICS] * eval_on


def table(runs: Runs, eval_on: bool) -> str:
    med = {spec: medians(results) for spec, results in runs.items()}
    gpu = any(m and m.get("peak_gpu_mb") is not None for m in med.values())
    rows = [harness.median_row(spec, scores_flat(results), MEDIANS) for spec, results in runs.items()]
    return harness.table(columns(med, gpu, eval_on), rows)


def batch_check(runs: Runs, variants: Sequence[Variant]) -> list[str]:
    """Does plain train on exactly ours' batches? Compares the first batches' input-id fingerprints of each
    ``ours[:overrides]`` with ``plain[:same overrides]``."""
    prints = {v.spec: {r["first_batch"] for r in runs[v.spec] if r.get("first_batch")} for v in variants}
    notes = [f"WARNING: {spec}: the first batch differs between rounds ({', '.join(sorted(fps))})"
             for spec, fps in prints.items() if len(fps) > 1]
    plains = {v.overrides: v.spec for v in variants if v.kind == "plain"}
    for ours in (v for v in variants if v.kind == "ours" and v.overrides in plains):
        plain = plains[ours.overrides]
        mine, theirs = prints[ours.spec], prints[plain]
        if not mine or not theirs:
            continue
        if mine == theirs:
            notes.append(f"same batches: {ours.spec} and {plain} trained on the same first batch "
                         f"(input ids {min(mine)})")
        else:
            notes.append(f"WARNING: {plain} and {ours.spec} start from different batches (first batch input ids "
                         f"{', '.join(sorted(theirs))} vs {', '.join(sorted(mine))}): the comparison is unfair")
    return notes


def footnotes(runs: Runs, variants: Sequence[Variant]) -> list[str]:
    notes = harness.failure_notes(runs)
    for spec, results in runs.items():
        bad_scores = [r["score"]["error"] for r in results if "error" in (r.get("score") or {})]
        if bad_scores:
            notes.append(f"{spec}: scoring failed in {len(bad_scores)} round(s): {bad_scores[0]}")
    ours, plain = medians(runs.get("ours", [])), medians(runs.get("plain", []))
    if ours and plain and ours["samples_per_s"] > 1.05 * plain["samples_per_s"]:
        notes.append("NOTE: ours is faster than the plain loop it is built on: check that they do the same work")
    return notes + batch_check(runs, variants)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), batch_size=32, max_length=128, rounds=3, timeout=1800,
                                timeout_of="subprocess", json="write every round's raw results to this file")
    parser.add_argument("--steps", type=int, default=20, help=f"measured steps (after {WARMUP_STEPS} warm-up steps)")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--variants", default="ours,plain,st", help="comma-separated specs kind[:key=value...]")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per worker")
    parser.add_argument("--pairs", type=int, default=None, help="use only the first N training pairs")
    parser.add_argument("--pairs-file", help='JSON lines {"query", "positive"} instead of the demo corpus')
    parser.add_argument("--eval", action="store_true", help="score each trained model (ndcg@10, recall@10)")
    parser.add_argument("--eval-queries", type=int, default=None, help="score on the first N held-out queries")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    command = harness.announce()
    variants = {v.spec: v for v in parse_variants(args.variants)}
    untrained = None
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        work = Path(tmp)
        runs = harness.interleave(list(variants), args.rounds,
                                  lambda spec, round_no: measure(args, variants[spec], round_no, work), describe)
        if args.eval:
            untrained = harness.run_child(score_child, {**child_options(args, work), "model_dir": None}, work,
                                          args.timeout)
    report(args, command, list(variants.values()), runs, untrained)


def report(args: argparse.Namespace, command: str, variants: Sequence[Variant], runs: Runs,
           untrained: Result | None) -> None:
    devices = sorted({r["device"] for rs in runs.values() for r in rs if "device" in r}) or ["-"]
    data = args.pairs_file or "demo corpus"
    print(f"\nbatch {args.batch_size}, max_length {args.max_length}, {args.steps} measured steps after "
          f"{WARMUP_STEPS} warm-up steps, {args.rounds} interleaved rounds (medians), precision {args.precision}, "
          f"{args.threads} threads, device {', '.join(devices)}, data: {data}\n{harness.machine()}\n")
    print(table(runs, args.eval), end="")
    if untrained is not None:
        scored = (f"ndcg@10 {untrained['ndcg@10']:.4f}, recall@10 {untrained['recall@10']:.4f} "
                  f"({untrained['queries']} queries, corpus {untrained['corpus']})" if "error" not in untrained
                  else f"failed: {untrained['error']}")
        print(f"\nuntrained model: {scored}")
    notes = footnotes(runs, variants)
    if notes:
        print("\n" + "\n".join(notes))
    harness.save(args, command=command, warmup_steps=WARMUP_STEPS, runs=runs,
                 medians={spec: medians(rs) for spec, rs in runs.items()}, untrained=untrained)


if __name__ == "__main__":
    main()
