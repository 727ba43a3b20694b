"""bench_train.py's ``plain`` and ``seed``: hand-written PyTorch loops over the very batches of ``ours`` (the same
composed config and data module), with no Lightning; ``seed`` is the seed article's recipe (every text padded to
512 tokens, CLS pooling, a linear projection head)."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from typing import Any

from harness import Result
from train_common import StepClock, Variant, autocast, compose_cfg, device_of, fingerprint, token_counts, trained

SEED_RECIPE_LENGTH = 512


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

    from gte_pro.training.base_module import build_scheduler, param_groups

    optimizer = instantiate(cfg.optimizer)(param_groups(model), lr=cfg.model.lr)
    schedule = cfg.get("scheduler")
    scheduler = (build_scheduler(instantiate(schedule.fn), optimizer, schedule.warmup_ratio, cfg.trainer.max_steps)
                 if schedule else None)
    return instantiate(cfg.loss), optimizer, scheduler


def run_plain(opts: argparse.Namespace, variant: Variant, seed_recipe: bool = False) -> Result:
    import torch
    import torch.nn.functional as F

    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.modes.build import build_encoder, seed_and_precision
    from gte_pro.modes.build_data import build_datamodule
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

