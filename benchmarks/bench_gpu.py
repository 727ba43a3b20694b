"""One command for a GPU box (``make bench-gpu``, ~8 min): training throughput, MFU and peak memory of this
project's training path (bench_train.py's ``ours``: the composed config, gte_pro.modes.build, ``trainer.fit``) in bf16,
for BERT-sized encoders and Qwen2-sized decoders. ``.gpu/run.sh`` runs a subset that fits a 10-minute device call.

Usage::

    python benchmarks/bench_gpu.py [--sizes minilm,base] [--seq 128,256] [--batch 64,256] [--changes ...]
        [--decoders qwen2-0.5b,qwen2-1.5b] [--decoder-seq 256] [--decoder-batch 8,32] [--decoder-changes ...]
        [--steps 10] [--precision bf16-mixed] [--peak-tflops T] [--json FILE] [--cpu] [--timeout S] [--budget S]
        [--encoder-tokenizer DIR]

Rows, each in a fresh process (peak memory is per row):

- the grid: each encoder size (MiniLM-sized: 6 layers x 384; gte-base-sized: 12 layers x 768, both with random
  weights of that shape and the packaged BERT tokenizer, so no hub is needed) x each sequence length x each batch
  size, with sdpa attention, no GradCache, no torch.compile, no strategy;
- one change at a time on the largest size at the first sequence length and the last batch size: eager attention,
  GradCache (``loss.mini_batch_size`` = the first batch size), ``model.compile=true``, ``strategy=ddp devices=1``;
- the decoders (``model=tiny_qwen2``: last-token pooling, left padding, EOS appended, the instruction before each
  query; random weights of Qwen2-0.5B's or Qwen2-1.5B's shape, with Qwen2's real 151,936-row embedding matrix over
  the offline byte-level BPE tokenizer, which splits text into more tokens than Qwen2's own), each size x each
  ``--decoder-batch`` at ``--decoder-seq``, full fine-tune; then one change at a time on the largest decoder at the
  last batch size: LoRA (r 16, alpha 32, on peft's default targets q_proj and v_proj), gradient checkpointing,
  ``strategy=fsdp devices=1`` (FSDP's sharding path on one device).

The texts are the demo corpus cut at the sequence length (dynamic padding, so real tokens < positions). Figures:
samples/s, real tokens/s, padding, MFU = 6 x non-embedding parameters x padded tokens / s / the device's peak dense
bf16 FLOP/s (mfu.py's table of known devices, or ``--peak-tflops``), and peak GPU memory beside the estimate every run
prints (gte_pro/preflight/memory_estimate.py, texts at full length: an upper bound of these padded batches). The
FLOPs count the model's matrix products, not attention's scores (a few % at these lengths) nor a recompute: gradient
checkpointing's rows count 6N like full fine-tuning (its MFU falls by what the recompute costs). A LoRA row counts
what its step needs: the forward (2N) and the gradients of the activations (2N) through the frozen weights, no
weight gradients for them, plus 6 x the adapters' parameters, i.e. ~4N where full fine-tuning counts 6N. Without
CUDA it says so and exits 0; ``--cpu`` runs the same code path on the CPU instead (fp32, for tests: ``--sizes tiny
--decoders qwen2-tiny``).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness import Column, Result
from mfu import decoder_flops, peak_tflops, with_mfu
from train_common import WARMUP_STEPS
from train_runs import train_child

SIZES = {  # random_init_config of each encoder size (the packaged MiniLM tokenizer: BERT's vocabulary)
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128},
    "minilm": {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536},
    "base": {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072},
}
CHANGES = ("eager", "gradcache", "compile", "ddp")
QWEN2_VOCAB = 151_936  # the rows of Qwen2's embedding matrix (its tokenizer has 151,646 tokens)
DECODERS = {  # random_init_config of each decoder size over model=tiny_qwen2
    "qwen2-tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 2,
                   "intermediate_size": 128, "vocab_size": 4096},
    "qwen2-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                   "intermediate_size": 4864, "vocab_size": QWEN2_VOCAB},
    "qwen2-1.5b": {"hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
                   "intermediate_size": 8960, "vocab_size": QWEN2_VOCAB},
}
LORA = {"r": 16, "alpha": 32, "dropout": 0.0}
DECODER_CHANGES = ("lora", "checkpointing", "fsdp")


def row_overrides(size: str, seq: int, batch: int, change: str | None, first_batch: int,
                  tokenizer: str | None = None) -> list[str]:
    # key by key: bench_train's variant specs separate overrides with ":"
    overrides = ["model=tiny", *[f"model.random_init_config.{key}={value}" for key, value in SIZES[size].items()],
                 f"data.max_length={seq}",
                 f"data.batch_size={batch}", "data.max_train_rows=null"]
    if tokenizer:  # a machine without the packaged MiniLM (a GPU box) brings its tokenizer files alone
        overrides.append(f"model.name_or_path={Path(tokenizer).resolve()}")
    extra = {None: [], "eager": ["model.attn_implementation=eager"],
             "gradcache": [f"loss.mini_batch_size={first_batch}"], "compile": ["model.compile=true"],
             "ddp": ["strategy=ddp", "devices=1"]}[change]
    return overrides + extra


def decoder_overrides(size: str, seq: int, batch: int, change: str | None) -> list[str]:
    """A decoder row's overrides: ``++`` adds the keys tiny_qwen2 does not set (vocab_size, model.lora's)."""
    shape = {**DECODERS[size], "max_position_embeddings": max(seq, 512)}
    extra = {None: [], "lora": [f"++model.lora.{key}={value}" for key, value in LORA.items()],
             "checkpointing": ["model.gradient_checkpointing=true"], "fsdp": ["strategy=fsdp", "devices=1"]}[change]
    return ["model=tiny_qwen2", *[f"++model.random_init_config.{key}={value}" for key, value in shape.items()],
            f"data.max_length={seq}", f"data.batch_size={batch}", "data.max_train_rows=null", *extra]


def rows(args: argparse.Namespace) -> list[dict]:
    return encoder_rows(args) + decoder_rows(args)


def encoder_rows(args: argparse.Namespace) -> list[dict]:
    if not args.size_list:
        return []
    grid = [{"family": "encoder", "size": size, "seq": seq, "batch": batch, "change": None}
            for size in args.size_list for seq in args.seq_list for batch in args.batch_list]
    reference = {"family": "encoder", "size": args.size_list[-1], "seq": args.seq_list[0],
                 "batch": args.batch_list[-1]}
    return grid + [{**reference, "change": change} for change in args.change_list]


def decoder_rows(args: argparse.Namespace) -> list[dict]:
    if not args.decoder_list:
        return []
    grid = [{"family": "decoder", "size": size, "seq": args.decoder_seq, "batch": batch, "change": None}
            for size in args.decoder_list for batch in args.decoder_batch_list]
    reference = {"family": "decoder", "size": args.decoder_list[-1], "seq": args.decoder_seq,
                 "batch": args.decoder_batch_list[-1]}
    return grid + [{**reference, "change": change} for change in args.decoder_change_list]


def with_decoder_flops(result: Result) -> Result:
    """The child counts 6 x its parameters outside BERT's ``embeddings`` (a Qwen2's ``embed_tokens`` included, and
    no LoRA discount); a decoder row's FLOP/s are recounted here from its padded tokens/s."""
    if result.get("family") != "decoder" or "real_tokens_per_s" not in result:
        return result
    lora_r = LORA["r"] if result["change"] == "lora" else None
    params, per_token = decoder_flops(DECODERS[result["size"]], lora_r)
    padded_per_s = result["real_tokens_per_s"] / (1 - result["padding_fraction"])
    return {**result, "non_embedding_params": params, "flops_per_token": per_token,
            "gflops": per_token * padded_per_s / 1e9}


def fits(elapsed: float, expected: float, deadline: float | None) -> bool:
    """Whether a row expected to take ``expected`` seconds, started ``elapsed`` seconds in, ends by ``deadline``
    (None: no deadline). ``.gpu/run.sh``'s parts start no row that cannot end inside the device call."""
    return deadline is None or elapsed + expected <= deadline


def measure(row: dict, args: argparse.Namespace, work: Path) -> Result:
    overrides = (decoder_overrides(row["size"], row["seq"], row["batch"], row["change"]) if row["family"] == "decoder"
                 else row_overrides(row["size"], row["seq"], row["batch"], row["change"], args.batch_list[0],
                                    args.encoder_tokenizer))
    spec = ":".join(["ours", *overrides])
    payload = {"batch_size": row["batch"], "max_length": row["seq"], "steps": args.steps, "seed": 42,
               "precision": args.precision, "threads": args.threads, "pairs": None, "pairs_file": None,
               "eval_queries": None, "work_dir": str(work), "save_dir": None, "spec": spec}
    result = with_decoder_flops({**row, **harness.run_child(train_child, payload, work, args.timeout)})
    return {**result, "estimated_mb": estimated_mb(overrides, args.precision, cuda=not args.cpu)}


def estimated_mb(overrides: list[str], precision: str, cuda: bool) -> float | None:
    """The memory estimate a run prints (gte_pro.preflight.memory_estimate) for the row's config, in MB: texts at
    full length, so an upper bound of the demo corpus's dynamically padded batches."""
    from bench_memory import compose, estimated_peak

    try:
        return estimated_peak(compose([*overrides, f"precision={precision}"]), cuda=cuda) / 2**20
    except Exception as error:  # noqa: BLE001 - a figure beside the measurement; never fail the row for it
        print(f"estimate failed: {type(error).__name__}: {error}", flush=True)
        return None


def report(results: list[Result], skipped: list[dict], args: argparse.Namespace, device: str,
           tflops: float | None) -> None:
    print(f"\n{harness.machine()}\n{device}, precision {args.precision}, {args.steps} measured steps after "
          f"{WARMUP_STEPS} warm-up, peak {tflops or '?'} TFLOP/s for MFU\n")
    print(harness.table([
        Column("size", "size", numeric=False, key=True), Column("seq", "seq", "d", key=True),
        Column("batch", "batch", "d", key=True),
        Column("change", lambda r: r["change"] or "-", numeric=False, key=True),
        Column("samples/s", "samples_per_s", ".1f"), Column("real tokens/s", "real_tokens_per_s", ",.0f"),
        Column("padding", "padding_fraction", ".2f"), Column("MFU", "mfu", ".1%"),
        Column("peak GPU MB", "peak_gpu_mb", ",.0f"), Column("estimated MB", "estimated_mb", ",.0f"),
        Column("peak RSS MB", "peak_rss_mb", ",.0f")], results))
    for result in results:
        if "error" in result:
            print(f"FAILED: {describe(result)}: {result['error']}")
    for row in skipped:
        limit = f"--budget {args.budget:.0f} s" + (f" or --deadline {args.deadline:.0f} s" if args.deadline else "")
        print(f"not run (past {limit}): {describe(row)}")


def describe(row: dict) -> str:
    return f"{row['size']} seq {row['seq']} batch {row['batch']}" + (f" {row['change']}" if row["change"] else "")


def row_line(result: Result) -> str:
    """One row as it finishes (a run cut short still shows what it measured)."""
    if "error" in result:
        return f"{describe(result)}: FAILED {result['error']}"
    mfu = f", MFU {result['mfu']:.1%}" if "mfu" in result else ""
    gpu = f", peak GPU {result['peak_gpu_mb']:,.0f} MB" if result.get("peak_gpu_mb") else ""
    if result.get("estimated_mb"):
        gpu += f" (estimated {result['estimated_mb']:,.0f} MB)"
    return (f"{describe(result)}: {result['samples_per_s']:.1f} samples/s, {result['real_tokens_per_s']:,.0f} real "
            f"tokens/s, padding {result['padding_fraction']:.2f}{mfu}{gpu}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), timeout=600, timeout_of="row",
                                json="write every row's result to this file")
    parser.add_argument("--sizes", default="minilm,base", help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--seq", default="128,256")
    parser.add_argument("--batch", default="64,256")
    parser.add_argument("--changes", default=",".join(CHANGES), help="one-at-a-time changes ('' for none)")
    parser.add_argument("--encoder-tokenizer", default=None,
                        help="a folder with the BERT tokenizer for the encoder rows (default: the packaged MiniLM's)")
    parser.add_argument("--decoders", default="qwen2-0.5b,qwen2-1.5b",
                        help=f"comma-separated, of {', '.join(DECODERS)} ('' for none)")
    parser.add_argument("--decoder-seq", type=int, default=256)
    parser.add_argument("--decoder-batch", default="8,32")
    parser.add_argument("--decoder-changes", default=",".join(DECODER_CHANGES),
                        help="one-at-a-time changes on the largest decoder ('' for none)")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--precision", default="bf16-mixed", choices=("bf16-mixed", "32-true"))
    parser.add_argument("--peak-tflops", type=float, default=None, help="the device's peak dense bf16 TFLOP/s")
    parser.add_argument("--threads", type=int, default=4, help="CPU threads per process (data loading)")
    parser.add_argument("--budget", type=float, default=420,
                        help="start no row after this many seconds (each row is a fresh process: ~30 s for an encoder "
                             "on an H200 machine); the rows not run are listed")
    parser.add_argument("--deadline", type=float, default=None,
                        help="seconds from the start by which every row must end: a row starts only when the longest "
                             "row so far (or --row-seconds, before any) would end by then")
    parser.add_argument("--row-seconds", type=float, default=30.0,
                        help="a row's expected seconds before one has run (for --deadline)")
    parser.add_argument("--cpu", action="store_true", help="run on the CPU when there is no CUDA (tests)")
    args = parser.parse_args(argv)
    args.size_list, args.change_list = names(args.sizes), names(args.changes)
    args.seq_list, args.batch_list = harness.int_list(args.seq), harness.int_list(args.batch)
    args.decoder_list, args.decoder_change_list = names(args.decoders), names(args.decoder_changes)
    args.decoder_batch_list = harness.int_list(args.decoder_batch)
    for name, values, valid in (("--sizes", args.size_list, SIZES), ("--changes", args.change_list, CHANGES),
                                ("--decoders", args.decoder_list, DECODERS),
                                ("--decoder-changes", args.decoder_change_list, DECODER_CHANGES)):
        if unknown := sorted(set(values) - set(valid)):
            parser.error(f"{name}: unknown {', '.join(unknown)}; valid choices: {', '.join(valid)}")
    return args


def names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def main(argv: list[str] | None = None) -> int:
    import torch

    args = parse_args(argv)
    if not torch.cuda.is_available() and not args.cpu:
        print("no CUDA device here: make bench-gpu measures GPU training and has nothing to do on this machine "
              "(--cpu runs the same rows on the CPU)")
        return 0
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else (
        f"CPU ({torch.backends.cpu.get_cpu_capability()})")
    tflops = peak_tflops(device, args.peak_tflops) if torch.cuda.is_available() else None
    harness.announce()
    print(f"device: {device}, peak {tflops or '?'} TFLOP/s dense bf16 for MFU", flush=True)
    results, skipped, start, longest = [], [], time.monotonic(), args.row_seconds
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as tmp:
        for row in rows(args):
            elapsed = time.monotonic() - start
            if (results and elapsed > args.budget) or not fits(elapsed, longest, args.deadline):
                skipped.append(row)
                continue
            began = time.monotonic()
            results.append(with_mfu(measure(row, args, Path(tmp)), tflops))
            longest = max(longest, time.monotonic() - began) if len(results) > 1 else time.monotonic() - began
            print(row_line(results[-1]), flush=True)
            harness.save(args, device=device, peak_tflops=tflops, rows=results, not_run=skipped)
    report(results, skipped, args, device, tflops)
    harness.save(args, device=device, peak_tflops=tflops, rows=results, not_run=skipped)
    return 0


if __name__ == "__main__":
    sys.exit(main())
