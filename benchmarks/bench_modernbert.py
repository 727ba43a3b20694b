"""ModernBERT's training step on this machine: attention implementation x ``model.length_chunks``.

A small randomly initialised ModernBERT (``--layers`` x ``--hidden``, every third layer global, the others a
128-token sliding window, as gte-modernbert-base; the packaged MiniLM tokenizer) in training mode runs the contrastive
step's forward and backward: the queries and the documents of ``--batch-size`` demo-corpus pairs in file order
(mixed lengths), truncated at ``--max-length``, InfoNCE. No optimizer step: the backbone's cost is what differs.

Variants: ``sdpa`` with 1, 2 and 4 length chunks, and ``eager`` with 1 and 4 (``--variants``). All share one process
and the same weights; they run interleaved (A B C, A B C, ...: a neighbour's load hits every variant alike), each
round over the same ``--steps`` batches; medians over ``--rounds`` are reported, with the ratio to the first variant.
On a GPU, ``flash_attention_2`` (its kernel skips the padding) is a variant where the ``flash_attn`` package is
installed: ``--device cuda --bf16 --variants sdpa/1,sdpa/4,flash_attention_2/1``.

    make bench-modernbert ARGS="--rounds 5 --steps 3"                   # ~10 min on 2 CPU cores
    make bench-modernbert ARGS="--threads 1 --variants sdpa/1,sdpa/2,sdpa/4,eager/1 --steps 2"
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import harness
import torch
from harness import Column, Result

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_loss
from gte_pro.data.collate import PairCollator
from gte_pro.models.encoder import Encoder
from gte_pro.training.losses import InfoNCELoss

DEFAULT_VARIANTS = "sdpa/1,sdpa/2,sdpa/4,eager/1,eager/4"


def modernbert(attention: str, args: argparse.Namespace) -> Encoder:
    """The same random weights (seed 0) for every attention implementation."""
    torch.manual_seed(0)
    fields = {"model_type": "modernbert", "hidden_size": args.hidden, "num_hidden_layers": args.layers,
              "num_attention_heads": args.hidden // 64, "intermediate_size": args.hidden * 3 // 2,
              "max_position_embeddings": 512, "global_attn_every_n_layers": 3, "local_attention": 128}
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=fields, pooling="cls",
                           max_length=args.max_length, attn_implementation=attention)
    return encoder.to(args.device).train()


def batches(args: argparse.Namespace, collate: PairCollator) -> list[dict[str, Any]]:
    """``--steps`` batches of demo-corpus pairs, tokenized up front (tokenization is not what is measured)."""
    rows = [(ex.query, ex.positives[0], []) for ex in harness.demo_splits(args.cache_dir).train]
    out = []
    for step in range(args.steps):
        batch = collate(rows[step * args.batch_size : (step + 1) * args.batch_size])
        out.append({side: {k: v.to(args.device) for k, v in batch[side].items()} for side in ("query", "doc")})
    return out


def train_step(encoder: Encoder, loss_fn: InfoNCELoss, batch: dict[str, Any], bf16: bool = False) -> float:
    device_type = batch["query"]["input_ids"].device.type
    with torch.autocast(device_type, dtype=torch.bfloat16, enabled=bf16):  # flash_attention_2 takes no fp32
        loss = loss_fn(encoder(**batch["query"]), encoder(**batch["doc"])).loss
    loss.backward()
    encoder.zero_grad(set_to_none=True)
    return float(loss.detach())


def measure(args: argparse.Namespace) -> tuple[dict[str, list[Result]], dict[str, float]]:
    names = args.variants.split(",")
    encoders = {attention: modernbert(attention, args) for attention in {name.split("/")[0] for name in names}}
    loss_fn = default_loss("infonce", temperature=0.05)
    data = batches(args, PairCollator(encoders[names[0].split("/")[0]].tokenizer, args.max_length))
    real = sum(int(b[s]["attention_mask"].sum()) for b in data for s in ("query", "doc"))
    padded = sum(b[s]["attention_mask"].numel() for b in data for s in ("query", "doc"))
    for encoder in encoders.values():  # the first step of each implementation allocates and warms its kernels
        train_step(encoder, loss_fn, data[0], args.bf16)

    def once(name: str, round_no: int) -> Result:
        attention, chunks = name.split("/")
        encoder = encoders[attention]
        encoder.length_chunks = int(chunks)
        with harness.timed() as timing:
            losses = [train_step(encoder, loss_fn, batch, args.bf16) for batch in data]
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()  # the backward's kernels are part of the step
        pairs = args.batch_size * len(data)
        return {"samples_per_s": pairs / timing.wall_s, "cpu_ms_per_pair": 1000 * timing.cpu_s / pairs,
                "loss": losses[0]}

    runs = harness.interleave(names, args.rounds, once, lambda r: f"{r['samples_per_s']:.2f} pairs/s")
    return runs, {"real_token_share": real / padded}


def main() -> None:
    parser = harness.parser(__doc__)
    harness.add_common(parser, batch_size=32, max_length=256, rounds=5, timeout_of=None, cache_dir=True)
    parser.add_argument("--steps", type=int, default=3, help="batches per variant and round")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--hidden", type=int, default=384)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", default=DEFAULT_VARIANTS, help="attention/chunks, comma-separated")
    parser.add_argument("--bf16", action="store_true", help="autocast to bf16 (flash_attention_2 needs it)")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's); on a CPU shared with other "
                        "work, 1 thread keeps a descheduled thread from stalling the others at every parallel region")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    command = harness.announce()
    runs, shape = measure(args)
    rows = [harness.median_row(name, results, ["samples_per_s", "cpu_ms_per_pair", "loss"])
            for name, results in runs.items()]
    base = rows[0].get("samples_per_s")
    columns = [Column("attention / length chunks", "variant", numeric=False, key=True),
               Column("pairs/s (median)", "samples_per_s", ".2f"),
               Column(f"vs {rows[0]['variant']}", lambda r: harness.ratio(r.get("samples_per_s"), base)),
               Column("CPU ms per pair", "cpu_ms_per_pair", ".0f"),
               Column("first batch's loss", "loss", ".4f")]
    print(f"\n{harness.machine()}")
    print(f"ModernBERT {args.layers}x{args.hidden} (random init), batch {args.batch_size}, max_length "
          f"{args.max_length}, {args.steps} batches x {args.rounds} interleaved rounds; real tokens "
          f"{100 * shape['real_token_share']:.0f}% of the padded batch\n")
    print(harness.table(columns, rows))
    for note in harness.failure_notes(runs):
        print(f"\n{note}", file=sys.stderr)
    harness.save(args, command=command, runs=runs, rows=rows, **shape)


if __name__ == "__main__":
    main()
