"""Training throughput: this project's loop vs sentence-transformers' trainer vs a plain PyTorch loop vs the seed
article's recipe, on the same model, texts, batch size, max length and steps.

Each measurement runs in a fresh subprocess (peak RSS is per variant), variants are interleaved (A B C D, A B C D,
...) and medians are reported. Usage::

    python benchmarks/bench_train.py [--pairs 320] [--batch-size 32] [--max-length 128] [--steps 8] [--rounds 3]

Variants:
  ours        gte_pro's ContrastiveModule in a Lightning Trainer (dynamic padding, InfoNCE, AdamW)
  st          sentence-transformers' SentenceTransformerTrainer + MultipleNegativesRankingLoss
  plain       a hand-written PyTorch loop: same encoder, collation, loss and optimizer (the framework-overhead floor)
  seed        the seed article's recipe: pad every text to max_length=512, CLS pooling + a projection head
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = ("ours", "st", "plain", "seed")
WARMUP_STEPS = 2


# --- shared pieces (run inside the worker subprocess) -----------------------------------------------------------
def _pairs(n: int) -> list[tuple[str, str]]:
    from gte_pro.data.demo import load_demo_splits

    splits = load_demo_splits(os.environ.get("GTE_PRO_CACHE", "~/.cache/gte_pro"), val_fraction=0.1,
                              min_query_chars=10, min_doc_chars=40, max_distractors=1000)
    return [(ex.query, ex.positives[0]) for ex in splits.train[:n]]


def _non_embedding_params(model) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)


class _StepClock:
    """Wall time of the steps after the warm-up ones, and the tokens those steps processed."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.real_tokens = 0
        self.padded_tokens = 0

    def tick(self) -> None:
        self.times.append(time.perf_counter())

    def count(self, step: int, real: int, padded: int) -> None:
        if step >= WARMUP_STEPS:
            self.real_tokens += real
            self.padded_tokens += padded

    def seconds(self) -> float:
        return self.times[-1] - self.times[WARMUP_STEPS - 1]


def _batches(pairs, batch_size: int):
    for start in range(0, len(pairs) - batch_size + 1, batch_size):
        yield pairs[start : start + batch_size]


def _run_plain(args, pairs, seed_recipe: bool) -> dict:
    import torch

    from gte_pro import packaged_minilm_path
    from gte_pro.losses import InfoNCELoss
    from gte_pro.model import Encoder

    torch.manual_seed(0)
    encoder = Encoder(packaged_minilm_path(), max_length=512 if seed_recipe else args.max_length,
                      pooling="cls" if seed_recipe else None)
    head = torch.nn.Linear(encoder.dim, encoder.dim) if seed_recipe else torch.nn.Identity()
    params = list(encoder.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=2e-5)
    loss_fn = InfoNCELoss(0.05)
    # the seed recipe pads every text to 512 tokens; the plain loop pads each batch to its longest text
    padding = {"padding": "max_length", "max_length": 512} if seed_recipe else {"padding": True,
                                                                                "max_length": args.max_length}
    clock = _StepClock()
    step = 0
    while step < args.steps + WARMUP_STEPS:
        for batch in _batches(pairs, args.batch_size):
            if step >= args.steps + WARMUP_STEPS:
                break
            q = encoder.tokenizer([p[0] for p in batch], truncation=True, return_tensors="pt", **padding)
            d = encoder.tokenizer([p[1] for p in batch], truncation=True, return_tensors="pt", **padding)
            clock.count(step, int(q["attention_mask"].sum() + d["attention_mask"].sum()),
                        q["input_ids"].numel() + d["input_ids"].numel())
            qe = torch.nn.functional.normalize(head(encoder(**q)), dim=-1)
            de = torch.nn.functional.normalize(head(encoder(**d)), dim=-1)
            loss = loss_fn(qe, de).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            clock.tick()
            step += 1
    return {"clock": clock, "params": _non_embedding_params(encoder.backbone)}


def _run_ours(args, pairs) -> dict:
    import lightning.pytorch as pl
    import torch

    from gte_pro import packaged_minilm_path
    from gte_pro.data.datamodule import ContrastiveDataModule
    from gte_pro.data.records import Example
    from gte_pro.losses import InfoNCELoss
    from gte_pro.model import Encoder
    from gte_pro.module import ContrastiveModule

    class Pairs(ContrastiveDataModule):
        def load_rows(self):
            rows = [Example(q, [p]) for q, p in pairs]
            return rows, rows[:8], []

    clock = _StepClock()

    class Clock(pl.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            real = batch["num_tokens"]
            padded = batch["query"]["input_ids"].numel() + batch["doc"]["input_ids"].numel()
            clock.count(trainer.global_step - 1, real, padded)
            clock.tick()

    torch.manual_seed(0)
    encoder = Encoder(packaged_minilm_path(), max_length=args.max_length)
    data = Pairs(tokenizer=encoder.tokenizer, batch_size=args.batch_size, max_length=args.max_length)
    module = ContrastiveModule(encoder, InfoNCELoss(0.05), torch.optim.AdamW, lr=2e-5)
    trainer = pl.Trainer(max_steps=args.steps + WARMUP_STEPS, limit_val_batches=0, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         gradient_clip_val=1.0, callbacks=[Clock()], accelerator="cpu", devices=1)
    trainer.fit(module, datamodule=data)
    return {"clock": clock, "params": _non_embedding_params(encoder.backbone)}


def _run_st(args, pairs) -> dict:
    import datasets
    import torch
    from sentence_transformers import (
        SentenceTransformer,
        SentenceTransformerTrainer,
        SentenceTransformerTrainingArguments,
    )
    from sentence_transformers.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    from gte_pro import packaged_minilm_path

    torch.manual_seed(0)
    model = SentenceTransformer(packaged_minilm_path(), device="cpu")
    model.max_seq_length = args.max_length
    tokenizer = model.tokenizer
    dataset = datasets.Dataset.from_dict({"anchor": [p[0] for p in pairs], "positive": [p[1] for p in pairs]})
    clock = _StepClock()
    step_batches = list(_batches(pairs, args.batch_size))

    class Clock(TrainerCallback):
        def on_step_end(self, targs, state, control, **kwargs):
            # ST batches without shuffling here (see below): count the tokens of the same batch it just trained on
            batch = step_batches[(state.global_step - 1) % len(step_batches)]
            q = tokenizer([p[0] for p in batch], padding=True, truncation=True, max_length=args.max_length)
            d = tokenizer([p[1] for p in batch], padding=True, truncation=True, max_length=args.max_length)
            real = sum(map(sum, q["attention_mask"])) + sum(map(sum, d["attention_mask"]))
            padded = sum(map(len, q["input_ids"])) + sum(map(len, d["input_ids"]))
            clock.count(state.global_step - 1, real, padded)
            clock.tick()

    out = Path(os.environ.get("BENCH_TMP", "/tmp")) / "bench_st"
    targs = SentenceTransformerTrainingArguments(
        output_dir=str(out), per_device_train_batch_size=args.batch_size, max_steps=args.steps + WARMUP_STEPS,
        learning_rate=2e-5, warmup_ratio=0.0, logging_steps=1000, save_strategy="no", report_to="none",
        dataloader_drop_last=True, max_grad_norm=1.0, seed=0, use_cpu=True, disable_tqdm=True,
    )
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=dataset,
                                         loss=MultipleNegativesRankingLoss(model), callbacks=[Clock()])
    trainer._get_train_sampler = lambda *a, **k: torch.utils.data.SequentialSampler(dataset)  # same order as others
    trainer.train()
    return {"clock": clock, "params": _non_embedding_params(model[0].auto_model)}


def worker(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    pairs = _pairs(args.pairs)
    runner = {"ours": lambda: _run_ours(args, pairs), "st": lambda: _run_st(args, pairs),
              "plain": lambda: _run_plain(args, pairs, seed_recipe=False),
              "seed": lambda: _run_plain(args, pairs, seed_recipe=True)}[args.variant]
    result = runner()
    clock, seconds = result["clock"], result["clock"].seconds()
    samples = args.steps * args.batch_size
    print("RESULT " + json.dumps({
        "variant": args.variant,
        "samples_per_s": samples / seconds,
        "real_tokens_per_s": clock.real_tokens / seconds,
        "padding_fraction": 1 - clock.real_tokens / max(clock.padded_tokens, 1),
        # forward + backward ~ 6 FLOPs per parameter per token; padded tokens are computed too
        "gflops": 6 * result["params"] * clock.padded_tokens / seconds / 1e9,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=320)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=8, help="measured steps (after 2 warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        worker(args)
        return
    runs: dict[str, list[dict]] = {v: [] for v in args.variants.split(",")}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    for round_no in range(args.rounds):
        for variant in runs:  # interleaved: A B C D, A B C D, ...
            cmd = [sys.executable, __file__, "--variant", variant, "--pairs", str(args.pairs), "--batch-size",
                   str(args.batch_size), "--max-length", str(args.max_length), "--steps", str(args.steps),
                   "--threads", str(args.threads)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
            if proc.returncode or line is None:
                sys.exit(f"{variant} failed:\n{proc.stderr[-3000:]}")
            runs[variant].append(json.loads(line[7:]))
            print(f"round {round_no + 1}/{args.rounds} {variant}: {runs[variant][-1]['samples_per_s']:.1f} samples/s",
                  file=sys.stderr)
    _print_table(runs, args)


def _print_table(runs: dict[str, list[dict]], args) -> None:
    med = {v: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k != "variant"} for v, rs in runs.items()}
    base = med.get("st", {}).get("samples_per_s")
    print(f"\nbatch {args.batch_size}, max_length {args.max_length}, {args.steps} measured steps, "
          f"{args.rounds} interleaved rounds, medians, {args.threads} threads\n")
    print("| variant | samples/s | vs st | real tokens/s | padding | GFLOP/s | peak RSS MB |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for variant, m in med.items():
        ratio = f"{m['samples_per_s'] / base:.2f}x" if base else "-"
        print(f"| {variant} | {m['samples_per_s']:.1f} | {ratio} | {m['real_tokens_per_s']:.0f} | "
              f"{m['padding_fraction']:.2f} | {m['gflops']:.1f} | {m['peak_rss_mb']:.0f} |")


if __name__ == "__main__":
    main()
