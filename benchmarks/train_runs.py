"""The child processes of bench_train.py (and bench_gpu.py), one fresh process each through ``harness.run_child``:
``train_child`` trains one variant, ``score_child`` scores one saved model with the one evaluator of every variant."""

from __future__ import annotations

import argparse
from typing import Any

from harness import Result
from train_common import compose_cfg, device_of, parse_variants
from train_ours import run_ours
from train_plain import run_plain
from train_st import run_st


def score_model(opts: argparse.Namespace) -> Result:
    """NDCG@10 / Recall@10 of the model in ``opts.model_dir`` (None: the untrained one) on the held-out split."""
    from gte_pro.evaluation.metrics import evaluate_embeddings
    from gte_pro.models.encoder import Encoder
    from gte_pro.modes.build_data import build_datamodule
    from gte_pro.retrieval import RetrievalSet

    cfg = compose_cfg(opts)
    encoder = Encoder.load(opts.model_dir or cfg.model.name_or_path, max_length=cfg.eval.max_length,
                           query_prefix=cfg.model.query_prefix, doc_prefix=cfg.model.doc_prefix,
                           length_chunks=1).to(device_of())  # one padded pass, as the documented runs measured
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

