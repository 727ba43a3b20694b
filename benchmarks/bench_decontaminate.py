"""The cost of ``data.decontaminate`` on 200,000 training rows against a 1,000-query evaluation set.

It writes a synthetic JSON-lines file (like ``bench_scale.py``: a 4-12 word query, a 40-200 word passage and one
negative passage per row), a validation file of 200 rows, and a BEIR folder of ``--queries`` queries, each with one
relevant document, in a corpus of ``--corpus`` documents; ``--planted`` training rows repeat an evaluation text
(a third exact after normalisation, the rest with one word changed). Then, each in a fresh process with the same
token-cache folder (``data.decontaminate``):

- ``off``: builds the token cache (streams, cleans and tokenizes the file): the data start-up a run pays anyway;
- ``report`` and ``drop``: the scan against the validation rows and the BEIR set (drop also writes the filtered
  cache);
- ``report again``: a second start with the same data, which reads the stored report.

Reported per variant: the data module's ``prepare_data`` + ``setup`` wall time (the tokenizer load excluded), the
scan's own seconds and training rows/s, the process's peak RSS, the rows found and dropped, and the scan as a share
of the cold start-up. Usage::

    python benchmarks/bench_decontaminate.py [--rows 200000] [--queries 1000] [--corpus 10000] [--planted 300]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import harness
from harness import Column, Result

from gte_pro.modes.build_data import data_module

VAL_ROWS = 200
VARIANTS = (("off", "off"), ("report", "report"), ("drop", "drop"), ("report again", "report"))


def write_inputs(work: Path, args: argparse.Namespace) -> dict[str, str]:
    """The training file, the validation file and the BEIR folder (kept between runs of the same sizes)."""
    folder = work / f"data_{args.rows}_{args.queries}_{args.corpus}_{args.planted}"
    beir, train, val = folder / "beir", folder / "train.jsonl", folder / "val.jsonl"
    if not train.is_file():
        shutil.rmtree(folder, ignore_errors=True)
        (beir / "qrels").mkdir(parents=True)
        rng = random.Random(0)
        vocabulary = harness.words(rng, 20_000)

        def passage() -> str:
            return " ".join(rng.choices(vocabulary, k=rng.randint(40, 200)))

        def query(text: str) -> str:
            return " ".join(rng.sample(text.split(), 3) + rng.choices(vocabulary, k=rng.randint(1, 9)))

        docs = [passage() for _ in range(args.corpus)]
        queries = [query(docs[i]) for i in range(args.queries)]
        with (beir / "corpus.jsonl").open("w") as handle:
            handle.writelines(json.dumps({"_id": f"d{j}", "title": "", "text": d}) + "\n" for j, d in enumerate(docs))
        with (beir / "queries.jsonl").open("w") as handle:
            handle.writelines(json.dumps({"_id": f"q{i}", "text": q}) + "\n" for i, q in enumerate(queries))
        (beir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n"
                                                 + "".join(f"q{i}\td{i}\t1\n" for i in range(args.queries)))
        with val.open("w") as handle:
            for _ in range(VAL_ROWS):
                text = passage()
                handle.write(json.dumps({"query": query(text), "positive": text}) + "\n")
        every = max(args.rows // max(args.planted, 1), 1)
        with train.open("w") as handle:
            for i in range(args.rows):
                positive = passage()
                row = {"query": query(positive), "positive": positive, "negatives": [passage()]}
                if args.planted and i % every == 0 and i // every < args.planted:
                    j = (i // every) % args.queries
                    if (i // every) % 3 == 0:
                        row["query"] = queries[j].upper() + " ?"
                    else:
                        words = docs[j].split()
                        words[len(words) // 2] = "zzplanted"
                        row["positive"] = " ".join(words)
                handle.write(json.dumps(row) + "\n")
    return {"train": str(train), "val": str(val), "beir": str(beir)}


def start_child(payload: dict[str, Any]) -> Result:
    """The data module's start-up with ``data.decontaminate=payload["mode"]`` (tokenizer load excluded)."""
    from omegaconf import OmegaConf
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path
    from gte_pro.evaluation.sets import BeirEvalSets

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    sets = BeirEvalSets(OmegaConf.create({"eval": {"beir": [payload["beir"]], "split": "test"}}))
    start = time.perf_counter()
    module = data_module("jsonl", train_file=payload["train"], val_file=payload["val"], tokenizer=tokenizer,
                         cache_dir=payload["cache"], max_length=payload["max_length"], eval_sets=sets,
                         decontaminate=payload["mode"])
    module.prepare_data()
    module.setup("fit")
    seconds = time.perf_counter() - start
    report = module.decontamination or {}
    return {"start_s": seconds, "rows": len(module.train_rows), "scan_s": report.get("seconds"),
            "found": report.get("overlapping_rows"), "dropped": report.get("dropped_rows"),
            "by_field": report.get("rows_by_field"), **harness.peak_memory()}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), max_length=256, timeout=3600,
                                workdir="/tmp/gte_pro_bench_decontaminate")
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--corpus", type=int, default=10_000)
    parser.add_argument("--planted", type=int, default=300)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    harness.announce()
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    payload: dict[str, Any] = {**write_inputs(work, args), "cache": str(work / "cache"), "max_length": args.max_length}
    shutil.rmtree(payload["cache"], ignore_errors=True)
    rows = []
    for name, mode in VARIANTS:
        result = harness.run_child(start_child, {**payload, "mode": mode}, work, args.timeout)
        rows.append({"variant": name, **result})
        line = result.get("error") or f"{result['start_s']:.1f} s"
        print(f"{name}: {line}", file=sys.stderr, flush=True)
    report(rows, args)
    harness.save(args, results=rows)


def report(rows: list[Result], args: argparse.Namespace) -> None:
    cold = next((r["start_s"] for r in rows if r["variant"] == "off" and "start_s" in r), None)
    for row in rows:
        if row["variant"] == "report again":
            row["scan_s"] = None  # the stored report's figure, not this start's
        elif row.get("scan_s"):
            row["rows_per_s"] = args.rows / row["scan_s"]
            row["share"] = f"{row['scan_s'] / cold * 100:.0f}%" if cold else "-"
    print(f"\ndata=jsonl, {args.rows:,} training rows (query, positive, 1 negative), {VAL_ROWS}-row val file, BEIR "
          f"set of {args.queries:,} queries in {args.corpus:,} documents, {args.planted} planted duplicates, "
          f"max_length {args.max_length}, packaged MiniLM tokenizer\n{harness.machine()}\n")
    print(harness.table([
        Column("data.decontaminate", "variant", key=True), Column("start-up s", "start_s", ".1f"),
        Column("scan s", "scan_s", ".1f"), Column("rows/s", "rows_per_s", ",.0f"),
        Column("share of the cold start-up", "share"), Column("peak RSS MB", "peak_rss_mb", ".0f"),
        Column("rows found", "found"), Column("rows dropped", "dropped"), Column("training rows", "rows")], rows),
        end="")
    for row in rows:
        if "error" in row:
            print(f"\nFAILED: {row['variant']}: {row['error']}")


if __name__ == "__main__":
    main()
