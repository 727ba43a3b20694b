"""Hard-negative mining throughput: gte-pro's mining vs sentence-transformers' ``mine_hard_negatives``.

Same model (the packaged all-MiniLM-L6-v2), same rows (demo-corpus training pairs: query -> docstring body; the
corpus is their de-duplicated positives), same settings (rank window, num_negatives, relative margin, top
sampling, batch size, max_length, exact search without faiss), one process, same threads. The two run interleaved,
``--rounds`` times each; medians are reported. Each timing is the whole mining: embedding queries and corpus, the
search, the selection and the rows of the result (in memory; neither writes files).

The two read the rank window slightly differently (ours counts ranks before dropping false negatives, as the
contract of ``gte_pro.mining.core`` says; sentence-transformers after), so the negatives overlap but need not be
equal; the table shows how many of sentence-transformers' negatives we mined too.

    make bench-mine                     # or: .venv/bin/python benchmarks/bench_mine.py --docs 1000 --rounds 2
"""

from __future__ import annotations

import os

# mine_hard_negatives shows encode's progress bars even with verbose=False; tqdm reads this when it is imported
os.environ.setdefault("TQDM_DISABLE", "1")

from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import harness  # noqa: E402
from harness import Column, Result  # noqa: E402

from gte_pro import packaged_minilm_path  # noqa: E402
from gte_pro.config.defaults import default_mining_options  # noqa: E402
from gte_pro.data.records import Example  # noqa: E402
from gte_pro.mining.embed import mine_texts  # noqa: E402
from gte_pro.mining.options import MiningOptions  # noqa: E402
from gte_pro.mining.problem import build_problem  # noqa: E402
from gte_pro.mining.report import mined_rows  # noqa: E402
from gte_pro.models.encoder import Encoder  # noqa: E402

OURS, ST = "gte-pro mine", "sentence-transformers mine_hard_negatives"
Run = Callable[[], dict[str, list[str]]]  # -> query: its mined negatives


def demo_rows(count: int, cache_dir: str) -> list[Example]:
    """The first ``count`` demo training pairs (one positive each; mixed lengths)."""
    return harness.demo_splits(cache_dir).train[:count]


def ours(encoder: Encoder, rows: list[Example], options: MiningOptions, batch_size: int, max_length: int) -> Run:
    def run() -> dict[str, list[str]]:
        problem = build_problem(rows)
        mined = mine_texts(encoder, problem.queries, problem.corpus, problem.positives, options, batch_size,
                           max_length)
        return {row["query"]: row["negatives"] for row in mined_rows(problem, mined)}

    return run


def sentence_transformers(model: Any, rows: list[Example], options: MiningOptions, batch_size: int) -> Run:
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    dataset = Dataset.from_dict({"query": [r.query for r in rows], "positive": [r.positives[0] for r in rows]})

    def run() -> dict[str, list[str]]:
        mined = mine_hard_negatives(dataset, model, range_min=options.range_min, range_max=options.range_max,
                                    relative_margin=options.relative_margin, num_negatives=options.num_negatives,
                                    sampling_strategy=options.sampling, batch_size=batch_size, use_faiss=False,
                                    output_format="n-tuple", verbose=False)
        columns = [f"negative_{i + 1}" for i in range(options.num_negatives)]
        return {row["query"]: [row[c] for c in columns] for row in mined}

    return run


def measure(runs: dict[str, Run], docs: int, rounds: int) -> tuple[dict[str, list[Result]], list[Result]]:
    """Interleaved rounds; (every round's timing per variant, one row per variant with its medians)."""
    results, outputs = harness.timed_rounds(runs, rounds)
    rows = []
    for name, runs_of_name in results.items():
        row = harness.median_row(name, runs_of_name, ["seconds", "cpu_s"])
        if "error" not in row:
            row.update(docs_per_s=docs / row["seconds"], **_agreement(outputs, name))
        rows.append(row)
    return results, rows


def _agreement(outputs: dict[str, dict[str, list[str]]], name: str) -> Result:
    """Negatives per row, and the share of sentence-transformers' negatives that this variant mined too."""
    mine, reference = outputs.get(name, {}), outputs.get(ST, {})
    counts = [len(negatives) for negatives in mine.values()]
    shared = [len(set(mine[q]) & set(negs)) / len(negs) for q, negs in reference.items() if q in mine and negs]
    return {"negatives_per_row": sum(counts) / max(len(counts), 1),
            "shared_with_st": sum(shared) / len(shared) if shared else None}


def table(rows: list[Result]) -> str:
    base = next((r.get("docs_per_s") for r in rows if r["variant"] == ST), None)
    return harness.table([
        Column("variant", "variant", numeric=False, key=True), Column("docs/s (median)", "docs_per_s", ".1f"),
        Column("wall s (median)", "seconds", ".2f"), Column("CPU s", "cpu_s", ".1f"),
        Column("vs sentence-transformers", lambda r: harness.ratio(r["docs_per_s"], base)),
        Column("negatives per row", "negatives_per_row", ".2f"),
        Column("share of ST's negatives also mined", "shared_with_st", ".2f")], rows)


def main(argv: list[str] | None = None) -> None:
    parser = harness.add_common(harness.parser(__doc__), batch_size=64, max_length=128, rounds=2, timeout_of=None,
                                cache_dir=True, json="write every round's timings and the medians to this file")
    parser.add_argument("--docs", type=int, default=1000, help="training pairs: queries and corpus documents")
    parser.add_argument("--num-negatives", type=int, default=15)
    parser.add_argument("--range-min", type=int, default=10)
    parser.add_argument("--range-max", type=int, default=100)
    parser.add_argument("--relative-margin", type=float, default=0.05)
    args = parser.parse_args(argv)
    from sentence_transformers import SentenceTransformer

    rows = demo_rows(args.docs, args.cache_dir)
    options = default_mining_options(args.num_negatives, args.range_min, args.range_max,
                                     relative_margin=args.relative_margin)
    encoder = Encoder.load(packaged_minilm_path(), max_length=args.max_length, length_chunks=1).eval()
    model = SentenceTransformer(packaged_minilm_path(), device="cpu")
    model.max_seq_length = args.max_length
    runs = {OURS: ours(encoder, rows, options, args.batch_size, args.max_length),
            ST: sentence_transformers(model, rows, options, args.batch_size)}
    warm = rows[: min(len(rows), 2 * args.range_max)]  # first-call allocations stay out of the timings
    ours(encoder, warm, options, args.batch_size, args.max_length)()
    sentence_transformers(model, warm, options, args.batch_size)()
    docs = len(build_problem(rows).corpus)
    results, table_rows = measure(runs, docs, args.rounds)
    print(f"{len(rows)} demo pairs ({docs} corpus documents), all-MiniLM-L6-v2, batch {args.batch_size}, max_length "
          f"{args.max_length}, window [{args.range_min}, {args.range_max}), {args.num_negatives} negatives, relative "
          f"margin {args.relative_margin}, top sampling; median of {args.rounds} rounds\n{harness.machine()}\n")
    print(table(table_rows), end="")
    harness.save(args, runs=results, medians=table_rows)


if __name__ == "__main__":
    main()
