"""bench_train.py's ``st``: sentence-transformers' SentenceTransformerTrainer + MultipleNegativesRankingLoss on the
pairs of the composed data config, with the same schedule, clipping, seed and steps."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from harness import Result
from train_common import StepClock, Variant, compose_cfg, device_of, fingerprint, token_counts, trained

_ST_SCHEDULES = {"get_linear_schedule_with_warmup": "linear", "get_cosine_schedule_with_warmup": "cosine",
                 "get_constant_schedule_with_warmup": "constant_with_warmup"}


def st_pairs(cfg: Any, tokenizer: Any) -> Any:
    """The training pairs of the composed data config (after its cleaning and held-out split), as a dataset."""
    import datasets

    from gte_pro.modes.build_data import build_datamodule

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

