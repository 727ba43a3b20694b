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
and medians are reported (all three by ``benchmarks/harness.py``). The first ``WARMUP_STEPS`` steps are trained but
not timed. A variant that fails (an exception, a non-zero exit, the OOM killer, ``--timeout``) is recorded with its
reason and the other variants go on.

With ``--eval`` each trained model is saved in sentence-transformers layout and scored by one evaluator, in its own
subprocess: ``gte_pro.models.encoder.Encoder(folder)`` embeds the held-out validation set of the composed data
config (the demo corpus by default) and ``gte_pro.evaluation.metrics.evaluate_embeddings`` computes NDCG@10 and
Recall@10. The untrained model is scored once for reference. The seed recipe's projection head has no
sentence-transformers form: it is not scored.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shlex
import shutil
import sys
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import harness
from harness import Column, Result

REPO = Path(__file__).resolve().parents[1]
CONF = REPO / "conf"
KINDS = ("ours", "plain", "st", "seed")
CONFIG_KINDS = ("ours", "plain", "seed")  # built from the composed Hydra config; accept overrides
WARMUP_STEPS = 2
SEED_RECIPE_LENGTH = 512
METRICS = ("ndcg@10", "recall@10")
MEDIANS = ("samples_per_s", "real_tokens_per_s", "padding_fraction", "gflops", "peak_rss_mb", "peak_gpu_mb", *METRICS)
Runs = dict[str, list[Result]]  # variant spec -> one result per round


@dataclass(frozen=True)
class Variant:
    spec: str
    kind: str
    overrides: tuple[str, ...] = ()


def parse_variants(text: str) -> list[Variant]:
    """``"ours,plain,ours:model.attn_implementation=eager"`` -> variants (duplicates dropped, order kept)."""
    variants: dict[str, Variant] = {}
    for spec in (s.strip() for s in text.split(",") if s.strip()):
        kind, *overrides = spec.split(":")
        if kind not in KINDS:
            raise SystemExit(f"unknown variant {kind!r} in {spec!r}; valid: {', '.join(KINDS)}")
        if overrides and kind not in CONFIG_KINDS:
            raise SystemExit(f"{spec!r}: only {', '.join(CONFIG_KINDS)} take Hydra overrides")
        if bad := [o for o in overrides if "=" not in o]:
            raise SystemExit(f"{spec!r}: overrides must be key=value, got {bad}")
        variants.setdefault(spec, Variant(spec, kind, tuple(overrides)))
    if not variants:
        raise SystemExit("--variants is empty")
    return list(variants.values())


# --- the composed config (worker side) -----------------------------------------------------------------------------
def base_overrides(opts: argparse.Namespace) -> list[str]:
    """Hydra overrides every variant shares: the benchmark's sizes, and no logging, checkpoints or validation."""
    overrides = [
        f"seed={opts.seed}", f"data.batch_size={opts.batch_size}", f"data.max_length={opts.max_length}",
        f"trainer.max_steps={opts.steps + WARMUP_STEPS}", "trainer.max_epochs=-1", f"precision={opts.precision}",
        "logger=none", "callbacks=none", "trainer.num_sanity_val_steps=0", "++trainer.limit_val_batches=0",
        "++trainer.enable_checkpointing=false", "++trainer.enable_progress_bar=false",
        "++trainer.enable_model_summary=false",
    ]
    if opts.pairs_file:
        overrides += ["data=jsonl", f"data.train_file={Path(opts.pairs_file).resolve()}"]
    if opts.pairs:
        overrides.append(f"data.max_train_rows={opts.pairs}")
    return overrides


def compose_cfg(opts: argparse.Namespace, extra: Sequence[str] = ()) -> Any:
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=base_overrides(opts) + list(extra))
    with open_dict(cfg):
        cfg.paths.output_dir = opts.work_dir  # normally Hydra's run folder; nothing is written there
    return cfg


def device_of() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(opts: argparse.Namespace) -> Any:
    import torch

    if opts.precision == "bf16-mixed":
        return torch.autocast(device_of().type, dtype=torch.bfloat16)
    return nullcontext()


# --- measurement helpers (worker side) ----------------------------------------------------------------------------
class StepClock:
    """Per step: wall time at its end (after a device sync), real and padded tokens, loss. Warm-up steps are
    recorded but not counted."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.real: list[int] = []
        self.padded: list[int] = []
        self.losses: list[float] = []

    def tick(self, real: int, padded: int, loss: Any) -> None:
        self.times.append(harness.clock())
        self.real.append(int(real))
        self.padded.append(int(padded))
        self.losses.append(float(loss))

    def summary(self, batch_size: int, params: int) -> Result:
        if len(self.times) <= WARMUP_STEPS:
            raise RuntimeError(f"only {len(self.times)} steps ran: too little data for the requested steps?")
        seconds = self.times[-1] - self.times[WARMUP_STEPS - 1]
        steps = len(self.times) - WARMUP_STEPS
        real, padded = sum(self.real[WARMUP_STEPS:]), sum(self.padded[WARMUP_STEPS:])
        return {
            "measured_steps": steps, "seconds": seconds, "samples_per_s": steps * batch_size / seconds,
            "real_tokens_per_s": real / seconds, "padding_fraction": 1 - real / max(padded, 1),
            # forward + backward ~ 6 FLOPs per parameter per token; padded positions are computed too
            "gflops": 6 * params * padded / seconds / 1e9, "losses": self.losses,
            "step_seconds": [b - a for a, b in zip(self.times, self.times[1:], strict=False)],
        }


def token_counts(*features: dict[str, Any], chunks: int = 1) -> tuple[int, int]:
    """(real, computed) tokens of tokenized batches: a pass in length chunks computes each chunk at its own width
    (``model.length_chunks``), one pass the whole padded tensor."""
    from gte_pro.models.length_chunks import padded_positions

    lengths = [f["attention_mask"].sum(dim=1).cpu().numpy() for f in features]
    return (sum(int(n.sum()) for n in lengths),
            sum(padded_positions(n, chunks, f["input_ids"].shape[1]) for n, f in zip(lengths, features, strict=True)))


def fingerprint(*features: dict[str, Any]) -> str:
    """A hash of the input ids of a batch: equal batches, equal fingerprints."""
    digest = hashlib.sha1()
    for f in features:
        ids = f["input_ids"].detach().cpu().contiguous()
        digest.update(str(tuple(ids.shape)).encode() + ids.numpy().tobytes())
    return digest.hexdigest()[:12]


def non_embedding_params(model: Any) -> int:
    return sum(p.numel() for name, p in model.named_parameters() if "embeddings" not in name)


def trained(clock: StepClock, batch_size: int, backbone: Any, first_batch: str | None) -> Result:
    """What every variant reports: its throughput figures, its peak memory, the fingerprint of its first batch."""
    return {**clock.summary(batch_size, non_embedding_params(backbone)), **harness.peak_memory(),
            "first_batch": first_batch}


# --- ours: the product path ---------------------------------------------------------------------------------------
def run_ours(opts: argparse.Namespace, variant: Variant) -> Result:
    from lightning.pytorch import Callback

    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.modes.build import (
        build_datamodule,
        build_encoder,
        build_module,
        build_trainer,
        instantiate_dict,
        seed_and_precision,
    )

    cfg = compose_cfg(opts, variant.overrides)
    clock, first = StepClock(), {}

    class Clock(Callback):
        def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if "batch" not in first:
                first["batch"] = fingerprint(batch["query"], batch["doc"])
            clock.tick(*token_counts(batch["query"], batch["doc"], chunks=module.encoder.chunks_on(module.device)),
                       outputs["loss"])

    seed_and_precision(cfg)
    encoder = build_encoder(cfg)
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    module = build_module(cfg, encoder)
    trainer = build_trainer(cfg, [*instantiate_dict(cfg.get("callbacks")), Clock()], [])
    trainer.fit(module, datamodule=datamodule)
    result = trained(clock, cfg.data.batch_size, encoder.backbone, first.get("batch"))
    if opts.save_dir:
        export_sentence_transformers(module.encoder, opts.save_dir)
    return result


# --- plain and seed: hand-written loops over the same data module ---------------------------------------------------
def epochs(loader: Any, total_steps: int) -> Iterator[dict[str, Any]]:
    """``total_steps`` batches, iterating the loader again (a new permutation) after each epoch, and telling
    samplers that have one the epoch number, as Lightning does."""
    step, epoch = 0, 0
    while step < total_steps:
        for sampler in {id(s): s for s in (loader.sampler, loader.batch_sampler,
                                           getattr(loader.batch_sampler, "sampler", None))}.values():
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(epoch)
        epoch += 1
        for batch in loader:
            if step == total_steps:
                return
            yield batch
            step += 1


def pad_to(features: dict[str, Any], length: int, pad_id: int) -> dict[str, Any]:
    """The seed recipe: every batch padded to ``length`` positions (the attention mask marks them as padding)."""
    import torch.nn.functional as F

    return {k: F.pad(v, (0, length - v.shape[1]), value=pad_id if k == "input_ids" else 0) for k, v in
            features.items()}


def optimization(cfg: Any, model: Any) -> tuple[Any, Any, Any]:
    """(loss, optimizer, scheduler or None) exactly as ContrastiveModule configures them."""
    from hydra.utils import instantiate

    from gte_pro.training.module import build_scheduler, param_groups

    optimizer = instantiate(cfg.optimizer)(param_groups(model), lr=cfg.model.lr)
    schedule = cfg.get("scheduler")
    scheduler = (build_scheduler(instantiate(schedule.fn), optimizer, schedule.warmup_ratio, cfg.trainer.max_steps)
                 if schedule else None)
    return instantiate(cfg.loss), optimizer, scheduler


def run_plain(opts: argparse.Namespace, variant: Variant, seed_recipe: bool = False) -> Result:
    import torch
    import torch.nn.functional as F

    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.modes.build import build_datamodule, build_encoder, seed_and_precision
    from gte_pro.training.losses import split_documents

    # the recipe computes all 512 positions: no length chunks
    recipe = ([f"data.max_length={SEED_RECIPE_LENGTH}", "model.pooling=cls", "model.length_chunks=1"]
              if seed_recipe else [])
    cfg = compose_cfg(opts, [*recipe, *variant.overrides])
    if cfg.loss.get("mini_batch_size"):
        raise ValueError("plain/seed loops do not implement loss.mini_batch_size (GradCache)")
    device = device_of()
    seed_and_precision(cfg)
    encoder = build_encoder(cfg).to(device)
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    datamodule.prepare_data()
    datamodule.setup("fit")
    with torch.random.fork_rng(devices=[]):  # the head's init must not move the RNG the sampler draws from
        head = torch.nn.Linear(encoder.dim, encoder.dim) if seed_recipe else torch.nn.Identity()
    model = torch.nn.ModuleList([encoder, head.to(device)])
    loss_fn, optimizer, scheduler = optimization(cfg, model)
    clip = cfg.trainer.get("gradient_clip_val")

    def embed(features: dict[str, Any]) -> Any:
        features = {k: v.to(device) for k, v in features.items()}
        if seed_recipe:
            features = pad_to(features, SEED_RECIPE_LENGTH, encoder.tokenizer.pad_token_id)
            return F.normalize(head(encoder(**features)), dim=-1), features
        return encoder(**features), features

    clock, first = StepClock(), None
    for batch in epochs(datamodule.train_dataloader(), cfg.trainer.max_steps):
        first = first or fingerprint(batch["query"], batch["doc"])
        with autocast(opts):
            (query, q), (docs, d) = embed(batch["query"]), embed(batch["doc"])
            out = loss_fn(query, *split_documents(docs, query.shape[0], batch["num_negatives"]))
        out.loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        clock.tick(*token_counts(q, d, chunks=encoder.chunks_on(device)), out.loss.detach())
    result = trained(clock, cfg.data.batch_size, encoder.backbone, first)
    if opts.save_dir and not seed_recipe:  # the seed recipe's head has no sentence-transformers form
        export_sentence_transformers(encoder, opts.save_dir)
    return result


# --- st: sentence-transformers' trainer ------------------------------------------------------------------------------
_ST_SCHEDULES = {"get_linear_schedule_with_warmup": "linear", "get_cosine_schedule_with_warmup": "cosine",
                 "get_constant_schedule_with_warmup": "constant_with_warmup"}


def st_pairs(cfg: Any, tokenizer: Any) -> Any:
    """The training pairs of the composed data config (after its cleaning and held-out split), as a dataset."""
    import datasets

    from gte_pro.modes.build import build_datamodule

    datamodule = build_datamodule(cfg, tokenizer)
    datamodule.prepare_data()
    datamodule.setup("fit")
    qp, dp = cfg.model.get("query_prefix") or "", cfg.model.get("doc_prefix") or ""
    rows = datamodule.train_rows
    return datasets.Dataset.from_dict({"anchor": [qp + ex.query for ex in rows],
                                       "positive": [dp + ex.positives[0] for ex in rows]})


def st_arguments(opts: argparse.Namespace, cfg: Any) -> Any:
    from sentence_transformers import SentenceTransformerTrainingArguments

    total = int(cfg.trainer.max_steps)
    schedule = cfg.get("scheduler")
    return SentenceTransformerTrainingArguments(
        output_dir=str(Path(opts.work_dir) / "st"), per_device_train_batch_size=cfg.data.batch_size,
        max_steps=total, learning_rate=cfg.model.lr, weight_decay=cfg.optimizer.weight_decay,
        lr_scheduler_type=_ST_SCHEDULES[cfg.scheduler.fn._target_.rsplit(".", 1)[-1]] if schedule else "constant",
        warmup_steps=int(schedule.warmup_ratio * total) if schedule else 0,
        max_grad_norm=cfg.trainer.gradient_clip_val, seed=cfg.seed, bf16=opts.precision == "bf16-mixed",
        use_cpu=device_of().type == "cpu", dataloader_drop_last=True, logging_steps=10**6, save_strategy="no",
        report_to="none", disable_tqdm=True,
    )


def run_st(opts: argparse.Namespace, variant: Variant) -> Result:
    import torch
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from transformers import TrainerCallback

    cfg = compose_cfg(opts)
    torch.set_float32_matmul_precision(cfg.get("matmul_precision", "high"))
    model = SentenceTransformer(cfg.model.name_or_path, device=str(device_of()))
    model.max_seq_length = cfg.data.max_length
    clock, pending, first = StepClock(), {}, {}

    class CountingMNRL(MultipleNegativesRankingLoss):
        """MNRL that notes the tokens of the batch it is given (the batch the step trains on) and its loss."""

        def forward(self, sentence_features: Any, labels: Any) -> Any:
            features = list(sentence_features)
            if "batch" not in first:
                first["batch"] = fingerprint(*features)
            pending["features"] = features  # counted at the step's end, after the device sync, as for the others
            loss = super().forward(features, labels)
            pending["loss"] = loss.detach()
            return loss

    class Clock(TrainerCallback):
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            clock.tick(*token_counts(*pending["features"]), pending["loss"])

    targs = st_arguments(opts, cfg)
    loss = CountingMNRL(model, scale=1.0 / cfg.loss.temperature)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=st_pairs(cfg, model.tokenizer),
                                         loss=loss, callbacks=[Clock()])
    trainer.train()
    result = {**trained(clock, cfg.data.batch_size, model[0].auto_model, first.get("batch")),
              "st_optim": str(getattr(targs.optim, "value", targs.optim))}
    if opts.save_dir:
        model.save(opts.save_dir)
    return result


# --- scoring: one evaluator for every variant ------------------------------------------------------------------------
def score_model(opts: argparse.Namespace) -> Result:
    """NDCG@10 / Recall@10 of the model in ``opts.model_dir`` (None: the untrained one) on the held-out split."""
    from gte_pro.evaluation.metrics import evaluate_embeddings
    from gte_pro.models.encoder import Encoder
    from gte_pro.modes.build import build_datamodule
    from gte_pro.retrieval import RetrievalSet

    cfg = compose_cfg(opts)
    encoder = Encoder(opts.model_dir or cfg.model.name_or_path, max_length=cfg.eval.max_length,
                      query_prefix=cfg.model.query_prefix, doc_prefix=cfg.model.doc_prefix).to(device_of())
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    datamodule.prepare_data()
    datamodule.setup("validate")
    full = datamodule.retrieval
    n = min(opts.eval_queries or len(full.queries), len(full.queries))
    held_out = RetrievalSet(full.queries[:n], full.corpus, full.relevant[:n])
    batch = int(cfg.eval.batch_size)
    queries = encoder.encode([encoder.query_prefix + q for q in held_out.queries], batch_size=batch)
    corpus = encoder.encode([encoder.doc_prefix + d for d in held_out.corpus], batch_size=batch)
    metrics = evaluate_embeddings(queries, corpus, held_out.relevant)
    return {"ndcg@10": metrics["ndcg@10"], "recall@10": metrics["recall@10"], "queries": n,
            "corpus": len(held_out.corpus)}


# --- child entry points (run by harness.run_child, one fresh process each) ------------------------------------------
def _child_opts(payload: dict[str, Any]) -> argparse.Namespace:
    import torch

    torch.set_num_threads(payload["threads"])
    return argparse.Namespace(**payload)


def train_child(payload: dict[str, Any]) -> Result:
    """Train one variant (``payload["spec"]``)."""
    import torch

    opts = _child_opts(payload)
    variant = parse_variants(opts.spec)[0]
    runner = {"ours": run_ours, "plain": run_plain, "st": run_st,
              "seed": lambda o, v: run_plain(o, v, seed_recipe=True)}[variant.kind]
    return {**runner(opts, variant), "device": str(device_of()), "torch_threads": torch.get_num_threads()}


def score_child(payload: dict[str, Any]) -> Result:
    """Score one model folder (``payload["model_dir"]``; None: the untrained model)."""
    return score_model(_child_opts(payload))


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


def medians(results: Sequence[Result]) -> Result | None:
    """Medians over the successful rounds (None when every round failed); quality over the scored rounds."""
    flat = [{**r, **{k: v for k, v in (r.get("score") or {}).items() if k in METRICS}} for r in results]
    return harness.medians(flat, MEDIANS)


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
    rows = [{"variant": spec, **m} if m is not None else
            {"variant": spec, "error": runs[spec][0]["error"] if runs[spec] else "did not run"}
            for spec, m in med.items()]
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
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--steps", type=int, default=20, help=f"measured steps (after {WARMUP_STEPS} warm-up steps)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--variants", default="ours,plain,st", help="comma-separated specs kind[:key=value...]")
    parser.add_argument("--precision", choices=("32-true", "bf16-mixed"), default="32-true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="torch threads per worker")
    parser.add_argument("--pairs", type=int, default=None, help="use only the first N training pairs")
    parser.add_argument("--pairs-file", help='JSON lines {"query", "positive"} instead of the demo corpus')
    parser.add_argument("--eval", action="store_true", help="score each trained model (ndcg@10, recall@10)")
    parser.add_argument("--eval-queries", type=int, default=None, help="score on the first N held-out queries")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per subprocess before it is killed")
    parser.add_argument("--json", help="write every round's raw results to this file")
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    command = shlex.join([sys.executable, *sys.argv])
    print(f"$ {command}", flush=True)
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
    harness.write_json(args.json, {
        "command": command, "settings": vars(args), "warmup_steps": WARMUP_STEPS, "runs": runs,
        "medians": {spec: medians(rs) for spec, rs in runs.items()}, "untrained": untrained})


if __name__ == "__main__":
    main()
