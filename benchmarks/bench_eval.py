"""Corpus encoding throughput of gte-pro's evaluation vs sentence-transformers' ``encode``.

Same model (the packaged all-MiniLM-L6-v2), same texts (demo corpus documents, in file order), same batch size and
truncation, same threads. Variants run interleaved, ``--repeats`` times each; medians are reported.

    make bench-eval                     # or: .venv/bin/python benchmarks/bench_eval.py --texts 1000 --batch-size 32
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from gte_pro import packaged_minilm_path
from gte_pro.data.datamodule import EvalCollator, EvalTexts
from gte_pro.data.demo import load_demo_splits
from gte_pro.evaluation import RetrievalSet
from gte_pro.model import Encoder

Run = Callable[[], tuple[torch.Tensor, float]]  # -> (embeddings in input order, real-token share of the batches)


def demo_texts(count: int, cache_dir: str) -> list[str]:
    """Documents of the demo corpus (training positives, then distractors), in file order: lengths mixed."""
    splits = load_demo_splits(cache_dir, val_fraction=0.1, min_query_chars=10, min_doc_chars=40, max_distractors=1000)
    texts = [ex.positives[0] for ex in splits.train] + list(splits.distractors)
    return texts[:count]


def ours(encoder: Encoder, texts: Sequence[str], batch_size: int, sort: bool) -> Run:
    """The validation path: EvalTexts (sorted by token count) + EvalCollator + the encoder under inference mode.

    The timing includes the token-count pre-pass (a loader is built, so the texts are sorted, on every run)."""
    retrieval = RetrievalSet(queries=[texts[0]], corpus=list(texts), relevant=[{0}])
    collate = EvalCollator(encoder.tokenizer, encoder.max_length)

    def make_dataset() -> EvalTexts:
        if not sort:  # the same path, batches in file order
            dataset = EvalTexts(retrieval)
            dataset.items = sorted(dataset.items, key=lambda item: (item[0] < 0, abs(item[0])))
            return dataset
        return EvalTexts(retrieval, tokenizer=encoder.tokenizer, max_length=encoder.max_length)

    def run() -> tuple[torch.Tensor, float]:
        loader = DataLoader(make_dataset(), batch_size=batch_size, collate_fn=collate)
        out, real, padded = torch.empty(len(texts), encoder.dim), 0, 0
        with torch.inference_mode():
            for batch in loader:
                mask = batch["features"]["attention_mask"]
                real, padded = real + int(mask.sum()), padded + mask.numel()
                embeddings = encoder(**batch["features"])
                is_doc = batch["ids"] < 0
                out[-batch["ids"][is_doc] - 1] = embeddings[is_doc]
        return out, real / padded

    return run


def sentence_transformers_model(max_length: int) -> Any:
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(packaged_minilm_path(), device="cpu")
    model.max_seq_length = max_length
    return model


def st_encode(model: Any, texts: Sequence[str], batch_size: int) -> Run:
    """``SentenceTransformer.encode`` (which sorts by character length itself)."""

    def run() -> tuple[torch.Tensor, float]:
        return model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True), float("nan")

    return run


def measure(runs: dict[str, Run], count: int, repeats: int) -> dict[str, dict[str, float]]:
    """Interleaved repeats (drift in machine load hits every variant alike); median texts/s of each."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    results: dict[str, tuple[torch.Tensor, float]] = {}
    for _ in range(repeats):
        for name, run in runs.items():
            start = time.perf_counter()
            results[name] = run()
            times[name].append(time.perf_counter() - start)
    reference = results["sentence-transformers encode"][0]
    return {name: {"texts_per_s": count / statistics.median(times[name]),
                   "real_token_share": results[name][1],
                   "min_cosine_vs_st": float(F.cosine_similarity(results[name][0], reference.cpu()).min())}
            for name in runs}


def table(stats: dict[str, dict[str, float]]) -> str:
    base = stats["sentence-transformers encode"]["texts_per_s"]
    lines = ["| variant | texts/s (median) | vs sentence-transformers | real tokens / padded | min cosine vs ST |",
             "|---|---:|---:|---:|---:|"]
    for name, s in stats.items():
        share = "n/a" if s["real_token_share"] != s["real_token_share"] else f"{s['real_token_share']:.2f}"
        lines.append(f"| {name} | {s['texts_per_s']:.1f} | {s['texts_per_s'] / base:.2f}x | {share} | "
                     f"{s['min_cosine_vs_st']:.6f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cache-dir", default=os.environ.get("GTE_PRO_CACHE", "~/.cache/gte_pro"))
    args = parser.parse_args()
    texts = demo_texts(args.texts, args.cache_dir)
    encoder = Encoder(packaged_minilm_path(), max_length=args.max_length).eval()
    st_model = sentence_transformers_model(args.max_length)
    runs = {"gte-pro evaluation (sorted by tokens, inference mode)": ours(encoder, texts, args.batch_size, sort=True),
            "gte-pro evaluation, file order (no sort)": ours(encoder, texts, args.batch_size, sort=False),
            "sentence-transformers encode": st_encode(st_model, texts, args.batch_size)}
    # warm-up on a few batches: first-call allocations and lazy initialisation stay out of the timings
    ours(encoder, texts[:64], args.batch_size, sort=True)()
    st_encode(st_model, texts[:64], args.batch_size)()
    stats = measure(runs, len(texts), args.repeats)
    print(f"{len(texts)} demo-corpus documents, all-MiniLM-L6-v2, batch {args.batch_size}, max_length "
          f"{args.max_length}, {torch.get_num_threads()} threads, torch {torch.__version__}, median of "
          f"{args.repeats}\n")
    print(table(stats))


if __name__ == "__main__":
    main()
