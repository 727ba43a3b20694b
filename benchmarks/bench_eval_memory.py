"""Memory of ``mode=eval`` or ``mode=mine`` against the corpus size: synthetic corpora of 100k and 1M documents,
1 and 2 ranks.

For each size it writes a BEIR folder (20-60 word documents, 200 queries with one relevant document each), builds
the corpus's store in a fresh process (``--mode eval``: ``gte_pro.data.corpus_store``; ``--mode mine``:
``gte_pro.mining.corpus``; the corpus tokenized once onto disk), then runs with 1 process and with 2
(``strategy=ddp devices=2``) either ``python train.py mode=eval model=tiny eval.beir=[folder]`` or ``python train.py
mode=mine model=tiny data=jsonl data.train_file=<the 200 queries and their documents>
mine.corpus_files=[<folder>/corpus.jsonl]``. Reported per run: wall time, each rank's peak RSS (from the run's
metrics.json or mine_report.json) and the largest process's peak RSS seen from outside (``wait4``). ``--baseline
DIR`` runs the same commands in another checkout (e.g. a ``git worktree`` of an older commit, which read the corpus
into every rank's memory) for a before/after table. Usage::

    python benchmarks/bench_eval_memory.py [--mode eval|mine] [--docs 100000,1000000] [--ranks 1,2] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

import harness
from harness import Column, Result

QUERIES = 200
CODES = {"stored": "store on disk", "baseline": "baseline checkout"}


def write_beir(folder: Path, docs: int, seed: int) -> None:
    """``docs`` documents of 20-60 words; query i shares 3 words with document i * (docs // QUERIES)."""
    if (folder / "qrels" / "test.tsv").is_file():
        return
    rng = random.Random(seed)
    vocabulary = harness.words(rng, 20_000)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    step = docs // QUERIES
    with (folder / "corpus.jsonl").open("w") as corpus, (folder / "queries.jsonl").open("w") as queries:
        for j in range(docs):
            words = rng.choices(vocabulary, k=rng.randint(20, 60))
            corpus.write(json.dumps({"_id": f"d{j}", "title": "", "text": " ".join(words)}) + "\n")
            if j % step == 0 and j // step < QUERIES:
                query = rng.sample(words, 3) + rng.choices(vocabulary, k=3)
                queries.write(json.dumps({"_id": f"q{j // step}", "text": " ".join(query)}) + "\n")
    rows = [f"q{i}\td{i * step}\t1" for i in range(QUERIES)]
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "\n".join(rows) + "\n")


def write_pairs(folder: Path) -> Path:
    """The training rows of ``mode=mine``: each query with its relevant document's text as the positive."""
    pairs = folder / "pairs.jsonl"
    if pairs.is_file():
        return pairs
    wanted = dict(line.split("\t")[1::-1] for line in (folder / "qrels" / "test.tsv").read_text().splitlines()[1:])
    queries = {q["_id"]: q["text"] for q in map(json.loads, (folder / "queries.jsonl").open())}
    rows = []
    with (folder / "corpus.jsonl").open() as corpus:
        for doc in map(json.loads, corpus):
            if doc["_id"] in wanted:
                rows.append({"query": queries[wanted[doc["_id"]]], "positive": doc["text"]})
    pairs.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return pairs


def build_child(payload: dict[str, Any]) -> Result:
    """Build the corpus store as ``mode=eval`` or ``mode=mine`` with ``model=tiny`` would find it, in a fresh
    process."""
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path
    from gte_pro.data.beir import iter_beir_documents
    from gte_pro.data.corpus_store import open_corpus_store
    from gte_pro.mining.corpus import open_text_store

    tokenizer = AutoTokenizer.from_pretrained(packaged_minilm_path())
    corpus = Path(payload["folder"]) / "corpus.jsonl"
    start = time.perf_counter()
    if payload["mode"] == "mine":
        store = open_text_store([corpus], tokenizer, payload["max_length"], "", payload["cache"])
    else:
        store = open_corpus_store(corpus, partial(iter_beir_documents, corpus), tokenizer, payload["max_length"],
                                  "", payload["cache"])
    return {"build_s": time.perf_counter() - start, "documents": len(store),
            "peak_rss_mb": harness.proc_kb("VmHWM") / 1024,
            "store_mb": sum(f.stat().st_size for f in store.folder.iterdir()) / 2**20}


def mode_command(mode: str, folder: Path, args: argparse.Namespace) -> list[str]:
    if mode == "mine":
        return ["mode=mine", "data=jsonl", f"data.train_file={write_pairs(folder)}",
                f"mine.corpus_files=[{folder / 'corpus.jsonl'}]", f"mine.max_length={args.max_length}",
                f"mine.batch_size={args.batch_size}"]
    return ["mode=eval", f"eval.beir=[{folder}]", f"eval.max_length={args.max_length}",
            f"eval.batch_size={args.batch_size}"]


def mode_run(repo: Path, code: str, docs: int, ranks: int, folder: Path, cache: Path,
             args: argparse.Namespace) -> Result:
    work = Path(args.workdir)
    run_dir = work / f"run_{args.mode}_{code}_{docs}_{ranks}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = harness.train_command("model=tiny", *mode_command(args.mode, folder, args), f"devices={ranks}",
                                f"strategy={'ddp' if ranks > 1 else 'auto'}", f"paths.cache_dir={cache}",
                                f"hydra.run.dir={run_dir}", "logger=none")
    result = harness.run_train(cmd, work / f"log_{args.mode}_{code}_{docs}_{ranks}.txt", args.timeout, repo=repo)
    row = {"code": code, "docs": docs, "ranks": ranks, **result}
    if "error" not in result:
        report = json.loads((run_dir / ("mine_report.json" if args.mode == "mine" else "metrics.json")).read_text())
        row["ranks_peak_mb"] = report.get("peak_rss_mb_per_rank")
        row["mode_s"] = report["seconds"]
        if args.mode == "mine":
            row["corpus_size"] = report["corpus_size"]
        else:
            row["ndcg"] = report["sets"][folder.name]["metrics"]["ndcg@10"]
    line = (f"FAILED: {result['error']}" if "error" in result else
            f"{result['wall_s']:.0f} s, largest process {result['peak_rss_mb']:.0f} MB, ranks "
            f"{row['ranks_peak_mb']}")
    print(f"{args.mode}, {code}, {docs:,} docs, {ranks} rank(s): {line}", file=sys.stderr, flush=True)
    return row


def measure(docs: int, args: argparse.Namespace) -> list[Result]:
    work = Path(args.workdir)
    folder = work / f"beir_{docs}"
    write_beir(folder, docs, seed=docs)
    cache = work / f"cache_{docs}"
    shutil.rmtree(cache, ignore_errors=True)
    build = harness.run_child(build_child, {"folder": str(folder), "cache": str(cache), "mode": args.mode,
                                            "max_length": args.max_length}, work, args.timeout)
    print(f"store of {docs:,} docs: {build}", file=sys.stderr, flush=True)
    rows = [{"code": "store build", "docs": docs, "ranks": 1, **build}]
    codes = [("stored", harness.REPO)] + ([("baseline", Path(args.baseline))] if args.baseline else [])
    for ranks in harness.int_list(args.ranks):
        rows += [mode_run(repo, code, docs, ranks, folder, cache, args) for code, repo in codes]
    return rows


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = harness.add_common(harness.parser(__doc__), batch_size=256, max_length=64,
                                workdir="/tmp/gte_pro_bench_eval_memory")
    parser.add_argument("--mode", choices=("eval", "mine"), default="eval")
    parser.add_argument("--docs", default="100000,1000000")
    parser.add_argument("--ranks", default="1,2")
    parser.add_argument("--baseline", help="another checkout to run the same evaluations in (before/after)")
    return parser.parse_args(argv)


def report(rows: list[Result], args: argparse.Namespace) -> None:
    print(f"\ntrain.py mode={args.mode} model=tiny (2-layer BERT, random weights), {QUERIES} queries, "
          f"{args.mode}.max_length {args.max_length}, {args.mode}.batch_size {args.batch_size}\n{harness.machine()}\n")
    evals = [r for r in rows if r["code"] != "store build"]
    print(harness.table([
        Column("documents", lambda r: f"{r['docs']:,}", key=True), Column("ranks", "ranks", key=True),
        Column("corpus", lambda r: CODES.get(r["code"], r["code"]), numeric=False, key=True),
        Column("wall s", "wall_s", ".0f"), Column(f"{args.mode} s", "mode_s", ".0f"),
        Column("peak RSS per rank MB", lambda r: " / ".join(f"{mb:.0f}" for mb in r["ranks_peak_mb"])
               if r.get("ranks_peak_mb") else None, numeric=False),
        Column("largest process MB", "peak_rss_mb", ".0f"),
        Column("corpus size", "corpus_size") if args.mode == "mine" else Column("NDCG@10", "ndcg", ".4f")], evals))
    builds = [r for r in rows if r["code"] == "store build"]
    print(harness.table([
        Column("documents", lambda r: f"{r['docs']:,}", key=True), Column("store build s", "build_s", ".0f"),
        Column("build peak RSS MB", "peak_rss_mb", ".0f"), Column("store on disk MB", "store_mb", ".0f")], builds),
        end="")


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    harness.announce()
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    rows = [row for docs in harness.int_list(args.docs) for row in measure(docs, args)]
    report(rows, args)
    harness.save(args, results=rows)


if __name__ == "__main__":
    main()
