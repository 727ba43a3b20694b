"""Corpus encoding throughput of gte-pro's evaluation vs sentence-transformers' ``encode``.

Same model (the packaged all-MiniLM-L6-v2), same texts (demo corpus documents, in file order), same batch size and
truncation, same threads. Variants run interleaved, ``--repeats`` times each; medians are reported. The variants
share one process on purpose: the embeddings of each are compared with sentence-transformers' (min cosine).

    make bench-eval                     # or: .venv/bin/python benchmarks/bench_eval.py --texts 1000 --batch-size 32
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import harness
import numpy as np
import torch
import torch.nn.functional as F
from harness import Column, Result
from torch.utils.data import DataLoader

from gte_pro import packaged_minilm_path
from gte_pro.data.collate import EvalCollator
from gte_pro.data.datasets import EvalTexts
from gte_pro.models.encoder import Encoder
from gte_pro.retrieval import RetrievalSet

# -> (embeddings in input order, real-token share of the batches; None where the encoder does not say)
Run = Callable[[], tuple[torch.Tensor, float | None]]
REFERENCE = "sentence-transformers encode"


def demo_texts(count: int, cache_dir: str) -> list[str]:
    """Documents of the demo corpus (training positives, then distractors), in file order: lengths mixed."""
    splits = harness.demo_splits(cache_dir)
    texts = [ex.positives[0] for ex in splits.train] + list(splits.distractors)
    return texts[:count]


def ours(encoder: Encoder, texts: Sequence[str], batch_size: int, sort: bool) -> Run:
    """The validation path: EvalTexts (sorted by token count) + EvalCollator + the encoder under inference mode.

    The timing includes the tokenization (a dataset is built, so the texts are tokenized and sorted, every run)."""
    retrieval = RetrievalSet(queries=[texts[0]], corpus=list(texts), relevant=[{0}])
    collate = EvalCollator(encoder.tokenizer)

    def make_dataset() -> EvalTexts:
        dataset = EvalTexts(retrieval, encoder.tokenizer, encoder.max_length)
        if not sort:  # the same path, batches in file order
            dataset.order = np.arange(len(dataset))
        return dataset

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

    def run() -> tuple[torch.Tensor, None]:
        return model.encode(list(texts), batch_size=batch_size, convert_to_tensor=True), None

    return run


def measure(runs: dict[str, Run], count: int, repeats: int) -> tuple[dict[str, list[Result]], list[Result]]:
    """Interleaved repeats; (every repeat's timing per variant, one row per variant with its medians)."""
    rounds, outputs = harness.timed_rounds(runs, repeats, lambda out: {"real_token_share": out[1]})
    reference = outputs.get(REFERENCE)
    rows = []
    for name, results in rounds.items():
        row = harness.median_row(name, results, ["seconds", "real_token_share"])
        if "error" not in row:
            similar = None if reference is None else F.cosine_similarity(outputs[name][0], reference[0].cpu()).min()
            row.update(texts_per_s=count / row["seconds"], min_cosine_vs_st=None if similar is None else float(similar))
        rows.append(row)
    return rounds, rows


def table(rows: list[Result]) -> str:
    base = next((r.get("texts_per_s") for r in rows if r["variant"] == REFERENCE), None)
    return harness.table([
        Column("variant", "variant", numeric=False, key=True), Column("texts/s (median)", "texts_per_s", ".1f"),
        Column("vs sentence-transformers", lambda r: harness.ratio(r["texts_per_s"], base)),
        Column("real tokens / padded", lambda r: r.get("real_token_share", "n/a"), ".2f"),  # encode does not say
        Column("min cosine vs ST", "min_cosine_vs_st", ".6f")], rows)


def main(argv: list[str] | None = None) -> None:
    parser = harness.add_common(harness.parser(__doc__), batch_size=32, max_length=128, timeout_of=None,
                                cache_dir=True, json="write every repeat's timings and the medians to this file")
    parser.add_argument("--texts", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (medians reported)")
    args = parser.parse_args(argv)
    texts = demo_texts(args.texts, args.cache_dir)
    encoder = Encoder.load(packaged_minilm_path(), max_length=args.max_length, length_chunks=1).eval()
    st_model = sentence_transformers_model(args.max_length)
    runs = {"gte-pro evaluation (sorted by tokens, inference mode)": ours(encoder, texts, args.batch_size, sort=True),
            "gte-pro evaluation, file order (no sort)": ours(encoder, texts, args.batch_size, sort=False),
            REFERENCE: st_encode(st_model, texts, args.batch_size)}
    # warm-up on a few batches: first-call allocations and lazy initialisation stay out of the timings
    ours(encoder, texts[:64], args.batch_size, sort=True)()
    st_encode(st_model, texts[:64], args.batch_size)()
    rounds, rows = measure(runs, len(texts), args.repeats)
    print(f"{len(texts)} demo-corpus documents, all-MiniLM-L6-v2, batch {args.batch_size}, max_length "
          f"{args.max_length}, median of {args.repeats}\n{harness.machine()}\n")
    print(table(rows), end="")
    harness.save(args, runs=rounds, medians=rows)


if __name__ == "__main__":
    main()
