"""Memory per device (``make bench-memory``, ~1 min on 2 CPU cores): the estimate that every run prints before it
loads its model (gte_pro.preflight.memory_estimate), checked against the measured peak of real training steps, and the
estimate for the GTE models at a few batch sizes.

Usage::

    python benchmarks/bench_memory.py [--check] [--table] [--data] [--gradcache] [--batches 8,32,128] [--length 512]
        [--negatives 3] [--json FILE]

- ``--check``: small configs of each family (BERT, Qwen2, ModernBERT; fp32 and bf16 autocast; gradient
  checkpointing, LoRA, GradCache), each trained two steps on the CPU (full-length texts: the estimate's bound) with
  :class:`gte_pro.utils.live_bytes.LiveBytes` counting every live tensor: estimated vs measured peak and their ratio.
- ``--table``: the estimate per device (bf16-mixed, on a GPU: its CUDA allowance included) for gte-base,
  gte-large, gte-modernbert-base, gte-Qwen2-1.5B and gte-Qwen2-7B (their published shapes, built on the meta device:
  no download), full fine-tuning, with gradient checkpointing, LoRA + checkpointing, and FSDP over 8 GPUs.

- ``--gradcache``: GradCache (``loss.mini_batch_size``) at large batches, where the loss's embeddings and score
  matrix count beside one mini-batch's activations: the tiny BERT, (query, positive, 1 negative) at 32 tokens, fp32,
  batch 256 whole and in mini-batches of 16/32/64, and batch 1024 in 32: estimated vs measured peak, and what
  ``loss.mini_batch_size=auto`` picks with that estimate as the budget (the row's mini-batch, or more where the
  estimate is flat).

- ``--data``: the plan for the data's largest batch (what a run judges) against the measured peak of epoch 0 of
  the training loader's batches, on files of short, mixed and long texts (the tiny BERT; length chunks as on the
  CPU, one padded block, GradCache).

With no flag, ``--check`` and ``--table``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import Any

import harness
from harness import Column, Result
from memory_data import DATA_KINDS, measured_data_peak, planned_peak, write_texts
from memory_gradcache import auto_choice, measured_loss_peak
from train_common import CONF

MIB = 2**20
TINY = {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 512}
FAMILY = {"bert": ["model=tiny"], "qwen2": ["model=tiny_qwen2"], "modernbert": ["model=tiny_modernbert"]}
# name -> overrides on top of the family's tiny preset, batch 8 x (query, positive, 1 negative) at 128 tokens
CHECKS = {
    "fp32": [],
    "bf16": ["trainer.precision=bf16-mixed"],
    "checkpointing": ["model.gradient_checkpointing=true"],
    "lora": ["model.lora={r: 8, alpha: 16, dropout: 0.0}"],
    "gradcache": ["loss.mini_batch_size=8"],
}
# the published shapes (config.json) of the GTE models, on their own tokenizer's vocabulary size
GTE = {
    "gte-base": ("model=tiny", {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12,
                                "intermediate_size": 3072}),
    "gte-large": ("model=tiny", {"hidden_size": 1024, "num_hidden_layers": 24, "num_attention_heads": 16,
                                 "intermediate_size": 4096}),
    "gte-modernbert-base": ("model=tiny_modernbert", {
        "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12, "intermediate_size": 1152,
        "vocab_size": 50368, "global_attn_every_n_layers": 3, "local_attention": 128,
        "max_position_embeddings": 8192}),
    "gte-Qwen2-1.5B": ("model=tiny_qwen2", {
        "hidden_size": 1536, "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2,
        "intermediate_size": 8960, "vocab_size": 151646, "max_position_embeddings": 32768}),
    "gte-Qwen2-7B": ("model=tiny_qwen2", {
        "hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "intermediate_size": 18944, "vocab_size": 151646, "max_position_embeddings": 32768}),
}
VARIANTS = {"full": [], "checkpointing": ["model.gradient_checkpointing=true"],
            "LoRA + checkpointing": ["model.gradient_checkpointing=true", "model.lora={r: 16}"],
            "FSDP x8 + checkpointing": ["strategy=fsdp", "devices=8", "model.gradient_checkpointing=true"]}


def compose(overrides: list[str]) -> Any:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return hydra_compose("train", overrides=overrides)


def _fields(fields: dict) -> list[str]:
    return [f"++model.random_init_config.{key}={value}" for key, value in fields.items()]


def check_overrides(family: str, check: str) -> list[str]:
    tiny = {**TINY, **({"num_key_value_heads": 4} if family == "qwen2" else {})}
    return [*FAMILY[family], *_fields(tiny), "data.batch_size=8",
            "data.num_negatives=1", "data.max_length=128", *CHECKS[check]]


def estimated_peak(cfg: Any, cuda: bool = False) -> float:
    from gte_pro.preflight.memory_estimate import estimate, meta_backbone, shape_of
    from gte_pro.preflight.per_device import setup_of

    return estimate(shape_of(meta_backbone(cfg.model, str(cfg.get("task", "embed")))), setup_of(cfg, cuda)).peak


def measured_peak(cfg: Any, steps: int = 2) -> float:
    """The peak bytes of live tensors over ``steps`` training steps of the config's encoder on the CPU: every text
    at ``model.max_length`` tokens, InfoNCE over (query, positive, negatives), AdamW; GradCache as the module runs it
    (embed without gradients, then each mini-batch again with the loss's gradient)."""
    import torch

    from gte_pro.modes.build import build_encoder
    from gte_pro.utils.live_bytes import LiveBytes

    torch.manual_seed(0)
    encoder = build_encoder(cfg).train()
    batch = int(cfg.data.batch_size)
    texts = batch * (2 + int(cfg.data.num_negatives))
    ids = torch.randint(5, min(len(encoder.tokenizer), 1000), (texts, int(cfg.model.max_length)))
    mask = torch.ones_like(ids)
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-4)
    mixed = "mixed" in str(cfg.trainer.precision)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mixed else contextlib.nullcontext
    chunk = cfg.loss.get("mini_batch_size") or texts

    def loss_of(embeddings: torch.Tensor) -> torch.Tensor:
        scores = embeddings[:batch] @ embeddings[batch:].T / 0.05
        return torch.nn.functional.cross_entropy(scores.float(), torch.arange(batch))

    counter = LiveBytes()
    counter.add([*encoder.parameters(), *encoder.buffers()])
    with counter:
        for _ in range(steps):
            if chunk >= texts:
                with autocast():
                    loss = loss_of(encoder(ids, mask))
                loss.backward()
                del loss
            else:
                with torch.no_grad(), autocast():
                    cached = torch.cat([encoder(ids[i:i + chunk], mask[i:i + chunk]) for i in range(0, texts, chunk)])
                cached = cached.float().requires_grad_()
                loss_of(cached).backward()
                for i in range(0, texts, chunk):
                    with autocast():
                        part = encoder(ids[i:i + chunk], mask[i:i + chunk])
                    part.float().backward(cached.grad[i:i + chunk])
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return float(counter.peak)


# (data.batch_size, loss.mini_batch_size) of the GradCache rows (None: one forward over the batch)
GRADCACHE = [(256, None), (256, 16), (256, 32), (256, 64), (1024, 32)]


def gradcache_overrides(batch: int, mini_batch: int | str | None) -> list[str]:
    return [*FAMILY["bert"], *_fields(TINY), f"data.batch_size={batch}", "data.num_negatives=1",
            "data.max_length=32", f"loss.mini_batch_size={'null' if mini_batch is None else mini_batch}"]


def gradcache_rows() -> list[Result]:
    rows = []
    for batch, mini_batch in GRADCACHE:
        cfg = compose(gradcache_overrides(batch, mini_batch))
        estimated, measured = estimated_peak(cfg), measured_loss_peak(cfg)
        row: Result = {"batch": batch, "mini_batch": str(mini_batch or "whole"), "estimated_mib": estimated / MIB,
                       "measured_mib": measured / MIB, "ratio": estimated / measured, "auto": ""}
        if mini_batch is not None:  # this row's estimate as the budget: auto picks this row's mini-batch (or more)
            row["auto"] = str(auto_choice(compose(gradcache_overrides(batch, "auto")), estimated))
        rows.append(row)
        print(f"batch {batch} mini-batch {mini_batch}: estimated {estimated / MIB:.1f} MiB, measured "
              f"{measured / MIB:.1f} MiB", flush=True)
    return rows


# name -> overrides of the data checks (the bert family's tiny config, length chunks as on the CPU by default)
DATA_CHECKS = {"chunks": [], "one block": ["model.length_chunks=1"], "gradcache": ["loss.mini_batch_size=8"]}


def data_overrides(train_file: Any, cache_dir: Any, extra: list[str] | None = None) -> list[str]:
    return [*check_overrides("bert", "fp32"), "data=jsonl", f"data.train_file={train_file}", "data.num_negatives=3",
            f"paths.cache_dir={cache_dir}", *(extra or [])]


def data_rows(folder: Any, rows: int = 160) -> list[Result]:
    from pathlib import Path

    results = []
    for kind in DATA_KINDS:
        train_file = write_texts(Path(folder) / f"{kind}.jsonl", rows, kind)
        for check, extra in DATA_CHECKS.items():
            cfg = compose(data_overrides(train_file, Path(folder) / "cache", extra))
            (estimated, worst), measured = planned_peak(cfg), measured_data_peak(cfg)
            results.append({"texts": kind, "config": check, "estimated_mib": estimated / MIB,
                            "measured_mib": measured / MIB, "ratio": estimated / measured,
                            "full_length_mib": worst / MIB})
            print(f"{kind} {check}: estimated {estimated / MIB:.1f} MiB (full length {worst / MIB:.1f}), "
                  f"measured {measured / MIB:.1f} MiB", flush=True)
    return results


def check_rows() -> list[Result]:
    rows = []
    for family in FAMILY:
        for check in CHECKS:
            cfg = compose(check_overrides(family, check))
            estimated, measured = estimated_peak(cfg), measured_peak(cfg)
            rows.append({"family": family, "config": check, "estimated_mib": estimated / MIB,
                         "measured_mib": measured / MIB, "ratio": estimated / measured})
            print(f"{family} {check}: estimated {estimated / MIB:.1f} MiB, measured {measured / MIB:.1f} MiB",
                  flush=True)
    return rows


def table_rows(batches: list[int], length: int, negatives: int) -> list[Result]:
    rows = []
    for model, (preset, fields) in GTE.items():
        for variant, extra in VARIANTS.items():
            row: Result = {"model": model, "variant": variant}
            for batch in batches:
                cfg = compose([preset, *_fields(fields), "trainer.precision=bf16-mixed", f"data.batch_size={batch}",
                               f"data.num_negatives={negatives}", f"data.max_length={length}", *extra])
                row[f"b{batch}"] = estimated_peak(cfg, cuda=True) / 2**30
            rows.append(row)
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), json="write the rows to this file")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--data", action="store_true",
                        help="the data-based plan against epoch 0 of files of short, mixed and long texts (~5 min)")
    parser.add_argument("--gradcache", action="store_true",
                        help="GradCache at batch 256 and 1024: the loss's share, and what auto picks (~2 min)")
    parser.add_argument("--batches", default="8,32,128")
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--negatives", type=int, default=3)
    args = parser.parse_args(argv)
    if not args.check and not args.table and not args.data and not args.gradcache:
        args.check = args.table = True
    args.batch_list = harness.int_list(args.batches)
    return args


def main(argv: list[str] | None = None) -> int:
    from gte_pro.utils.quiet import quiet_third_party

    args = parse_args(argv)
    quiet_third_party()  # the dependencies' deprecation chatter, as in a run's log
    harness.announce()
    checks = check_rows() if args.check else []
    data: list[Result] = []
    if args.data:
        import tempfile

        with tempfile.TemporaryDirectory() as folder:
            data = data_rows(folder)
    gradcache = gradcache_rows() if args.gradcache else []
    table = table_rows(args.batch_list, args.length, args.negatives) if args.table else []
    print(f"\n{harness.machine()}\n")
    if checks:
        print(harness.table([Column("family", "family", numeric=False, key=True),
                             Column("config", "config", numeric=False, key=True),
                             Column("estimated MiB", "estimated_mib", ".1f"),
                             Column("measured MiB", "measured_mib", ".1f"),
                             Column("estimated / measured", "ratio", ".2f")], checks))
    if data:
        print("\nthe data's largest batch (tiny BERT, batch 8 x (query, positive, 3 negatives), 128 tokens, epoch 0 of "
              "160 rows):\n")
        print(harness.table([Column("texts", "texts", numeric=False, key=True),
                             Column("config", "config", numeric=False, key=True),
                             Column("estimated MiB", "estimated_mib", ".1f"),
                             Column("measured MiB", "measured_mib", ".1f"),
                             Column("estimated / measured", "ratio", ".2f"),
                             Column("full length MiB", "full_length_mib", ".1f")], data))
    if gradcache:
        print("\nGradCache (tiny BERT, fp32, (query, positive, 1 negative) at 32 tokens, InfoNCE and the cached loss "
              "of gte_pro.training.gradcache; auto: what loss.mini_batch_size=auto picks with this row's estimate as "
              "the budget):\n")
        print(harness.table([Column("batch", "batch", "d", key=True),
                             Column("mini-batch", "mini_batch", numeric=False, key=True),
                             Column("estimated MiB", "estimated_mib", ".1f"),
                             Column("measured MiB", "measured_mib", ".1f"),
                             Column("estimated / measured", "ratio", ".2f"),
                             Column("auto", "auto", numeric=False)], gradcache))
    if table:
        print(f"\nestimated GiB per device, bf16-mixed, {args.length} tokens, {args.negatives} negatives per query "
              f"(batch b: b x {2 + args.negatives} texts), AdamW, CUDA:\n")
        print(harness.table([Column("model", "model", numeric=False, key=True),
                             Column("variant", "variant", numeric=False, key=True),
                             *[Column(f"batch {b}", f"b{b}", ".1f") for b in args.batch_list]], table))
    harness.save(args, checks=checks, table=table, data=data, gradcache=gradcache)
    return 0


if __name__ == "__main__":
    sys.exit(main())
