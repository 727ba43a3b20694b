"""``mode=eval``: evaluate any encoder (hub name, local folder, an exported fine-tune) on BEIR folders.

    python train.py mode=eval model=encoder model.name_or_path=outputs/train/<run>/model eval.beir=[data/scifact]

Encoding goes through the same Lightning validation as training (length-sorted batches, inference mode, the
trainer's precision, the corpus sharded over ``devices``), so the numbers are the ones training logs. Writes
``<run dir>/metrics.json`` and ``<run dir>/metrics.md``. Without ``eval.beir`` the data module's held-out split is
evaluated instead.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from omegaconf import DictConfig, OmegaConf

from gte_pro.data.batching import LoaderOptions
from gte_pro.data.token_cache import Tokenization
from gte_pro.data.validation import Validation
from gte_pro.evaluation.report import HELD_OUT, merge_results, metrics_by_set, metrics_table, optimized_value
from gte_pro.evaluation.sets import EvalDataModule, eval_set_specs, load_eval_sets
from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build import (
    build_data_for,
    build_encoder,
    build_module,
    build_trainer,
    start_run,
    task_collaborators,
)
from gte_pro.training.base_module import TrainingModule
from gte_pro.utils.files import write_json_atomic, write_text_atomic
from gte_pro.utils.timing import peak_rss_mb_per_rank

log = logging.getLogger(__name__)


def eval_datamodule(cfg: DictConfig, module: TrainingModule) -> LightningDataModule:
    """The BEIR sets of ``eval.beir``, or (none named) the configured data module's held-out split; a reranker's
    serve each query's candidate pairs."""
    encoder = module.encoder
    sets = load_eval_sets(cfg, encoder.tokenizer, encoder.doc_prefix, encoder.max_length)
    if not sets:
        return build_data_for(cfg, module)
    form = Tokenization(encoder.tokenizer, int(cfg.eval.max_length), encoder.query_prefix, encoder.doc_prefix)
    # the data's worker processes; pinned memory and persistent workers are a training loader's
    loader = LoaderOptions(int(cfg.data.num_workers), pin_memory=False, persistent_workers=False)
    validation = Validation(eval_batch_size=int(cfg.eval.batch_size), val_distractors=None, loader=loader,
                            eval_sets=None, **{"pair_join": None, "candidates": None, **task_collaborators(module)})
    return EvalDataModule(sets, form, validation)


def _set_details(cfg: DictConfig, datamodule: Any) -> dict[str, dict[str, Any]]:
    """Where each set came from and how big it is, keyed like the metrics table."""
    origin = {}
    if cfg.get("eval") and cfg.eval.get("beir"):
        origin = {name: {"path": path, "split": split}
                  for path, split, name in eval_set_specs(cfg.eval.beir, cfg.eval.split)}
    return {(name or HELD_OUT): {**origin.get(name, {"data": cfg.data.get("_target_")}),
                                 "queries": len(rs.queries), "docs": len(rs.corpus)}
            for name, rs in datamodule.validation_sets()}


def evaluate(cfg: DictConfig) -> float | None:
    """Evaluate ``cfg.model`` as configured; write ``metrics.json`` + ``metrics.md``; return the optimized metric."""
    output_dir, _ = start_run(cfg)
    encoder = build_encoder(cfg)
    module = build_module(cfg, encoder)
    datamodule = eval_datamodule(cfg, module)
    # no checkpointing, early stopping or loggers: nothing is trained
    trainer = build_trainer(cfg, callbacks=[], loggers=[])
    start = time.perf_counter()
    flat = merge_results(trainer.validate(module, datamodule=datamodule, verbose=False))
    seconds = time.perf_counter() - start
    peaks = peak_rss_mb_per_rank()
    if trainer.is_global_zero:
        write_eval_report(output_dir, cfg, encoder, _set_details(cfg, datamodule), flat, seconds,
                          trainer.world_size, peaks)
    metric = cfg.get("optimized_metric")
    if metric and metric.count("/") == 1 and HELD_OUT not in metrics_by_set(flat):
        return None  # only named sets (eval.beir) were evaluated: there is no held-out val/<metric> to return
    return optimized_value(flat, metric)


def write_eval_report(output_dir: Path, cfg: DictConfig, encoder: Encoder | CrossEncoder,
                      details: dict[str, dict[str, Any]], flat: dict[str, float], seconds: float, world_size: int,
                      peaks: list[float]) -> None:
    by_set = metrics_by_set(flat)
    table = metrics_table(flat, sizes={name: (d["queries"], d["docs"]) for name, d in details.items()})
    texts = sum(d["queries"] + d["docs"] for d in details.values())
    summary = {
        "mode": "eval",
        "model": encoder.name_or_path,
        "task": cfg.task,
        "pooling": getattr(encoder, "pooling", None),  # a reranker (task=rerank) has neither
        "normalize": getattr(encoder, "normalize", None),
        "max_length": int(cfg.eval.max_length) if cfg.get("eval") else encoder.max_length,
        "query_prefix": encoder.query_prefix,
        "doc_prefix": encoder.doc_prefix,
        "precision": str(cfg.trainer.precision),
        "world_size": world_size,
        "seconds": round(seconds, 3),
        "texts_per_s": round(texts / max(seconds, 1e-9), 1),
        "peak_rss_mb_per_rank": [round(mb, 1) for mb in peaks],
        "sets": {name: {**details.get(name, {}), "metrics": values} for name, values in by_set.items()},
        "val": flat,
        "config": OmegaConf.to_container(cfg, resolve=True),
    }
    write_json_atomic(output_dir / "metrics.json", summary)
    shape = (f"reranking {cfg.eval.retriever}'s top {cfg.eval.rerank_depth}" if isinstance(encoder, CrossEncoder)
             else f"pooling {encoder.pooling}, normalize {encoder.normalize}")
    header = (f"# Retrieval evaluation\n\nmodel: `{encoder.name_or_path}` ({shape}), precision "
              f"{cfg.trainer.precision}, {world_size} process(es), "
              f"{seconds:.1f} s, peak RSS per process {', '.join(f'{mb / 1024:.2f}' for mb in peaks)} GiB\n\n")
    write_text_atomic(output_dir / "metrics.md", header + table)
    print(f"{table}\nmetrics: {output_dir / 'metrics.json'}\ntable:   {output_dir / 'metrics.md'}")
