"""bench_train.py's ``ours``: the product path (the composed config, gte_pro.modes.build, ``trainer.fit``)."""

from __future__ import annotations

import argparse
from typing import Any

from harness import Result
from train_common import StepClock, Variant, compose_cfg, fingerprint, token_counts, trained


def run_ours(opts: argparse.Namespace, variant: Variant) -> Result:
    from lightning.pytorch import Callback

    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.modes.build import (
        build_encoder,
        build_module,
        build_trainer,
        instantiate_dict,
        seed_and_precision,
    )
    from gte_pro.modes.build_data import build_datamodule

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

