"""What checking a shared cache before it is read costs (``gte_pro.utils.shared_cache``): a 200,000-row token cache
and a 100,000-document corpus store, checked by size only, by sampled blocks, and by a full xxh3-64 of every file,
with the files in the page cache (warm: a run that built or read the cache a moment ago) and evicted from it (cold:
``posix_fadvise(DONTNEED)`` on each file, so that the hash reads the disk).

The caches are synthetic but sized as bench-scale's (``make bench-scale``: 4-12 word queries, 40-200 word passages,
~1.3 tokens a word; its 200k token cache is ~354 MB): the token ids are random, the texts made-up words. They are
written with ``published_folder`` (which records ``checksums.json``), so the time to record the checksums at build
time is reported too. Each figure is the median of ``--rounds``. Usage::

    python benchmarks/bench_cache_verify.py [--rows 200000] [--documents 100000] [--rounds 5] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import harness
import numpy as np
import pyarrow as pa

from gte_pro.data.cache import SCHEMA
from gte_pro.utils import shared_cache
from gte_pro.utils.files import published_folder
from gte_pro.utils.tables import markdown_table

SAMPLED_BLOCKS, SAMPLED_BLOCK = 64, 64 << 10  # the sampled check: 64 blocks of 64 KiB per file, evenly spread


def _token_cache(tmp: Path, rows: int, rng: random.Random) -> None:
    vocabulary = harness.words(rng, 20_000)
    ids = np.random.default_rng(rng.randrange(2**32))
    with pa.OSFile(str(tmp / "train.arrow"), "wb") as sink, pa.ipc.new_stream(sink, SCHEMA) as writer:
        for start in range(0, rows, 2048):
            count = min(2048, rows - start)
            passages = [rng.choices(vocabulary, k=rng.randint(40, 200)) for _ in range(count)]
            queries = [rng.sample(p, 3) + rng.choices(vocabulary, k=rng.randint(1, 9)) for p in passages]
            q_ids = [ids.integers(0, 30_000, int(len(q) * 1.3) + 2).tolist() for q in queries]
            p_ids = [[ids.integers(0, 30_000, int(len(p) * 1.3) + 2).tolist()] for p in passages]
            writer.write_batch(pa.record_batch([
                pa.array(q_ids, pa.list_(pa.int32())), pa.array(p_ids, pa.list_(pa.list_(pa.int32()))),
                pa.array([[] for _ in passages], pa.list_(pa.list_(pa.int32()))),
                pa.array([len(q) + len(p[0]) for q, p in zip(q_ids, p_ids, strict=True)], pa.int32()),
                pa.array([" ".join(q) for q in queries]), pa.array([[" ".join(p)] for p in passages]),
                pa.array([[] for _ in passages], pa.list_(pa.string()))], schema=SCHEMA))
    (tmp / "meta.json").write_text(json.dumps({"rows": rows, "reports": [], "distractors": [], "val": []}))


def _corpus_store(tmp: Path, documents: int, rng: random.Random) -> None:
    ids = np.random.default_rng(rng.randrange(2**32))
    counts = np.array([int(rng.randint(40, 200) * 1.3) + 2 for _ in range(documents)], dtype=np.int64)
    ids.integers(0, 30_000, int(counts.sum()), dtype=np.int32).tofile(tmp / "tokens.bin")
    offsets = np.cumsum(counts) - counts
    np.save(tmp / "index.npy", np.stack([offsets, counts, counts * 5], axis=1))
    (tmp / "ids.txt").write_text("".join(json.dumps(f"doc-{j}") + "\n" for j in range(documents)))
    (tmp / "meta.json").write_text(json.dumps({"documents": documents, "anomalies": {}}))


def _evict(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            fd = os.open(path, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def _sizes(folder: Path) -> None:
    files = json.loads((folder / shared_cache.CHECKSUMS).read_text())["files"]
    assert all((folder / name).stat().st_size == entry["size"] for name, entry in files.items())


def _sampled(folder: Path) -> None:
    """Sizes, then ``SAMPLED_BLOCKS`` blocks of each file hashed (what a sampled check would read)."""
    _sizes(folder)
    for path in folder.iterdir():
        size = path.stat().st_size
        fd = os.open(path, os.O_RDONLY)
        try:
            for k in range(SAMPLED_BLOCKS):
                shared_cache.xxhash.xxh3_64(os.pread(fd, SAMPLED_BLOCK, k * max(size - SAMPLED_BLOCK, 0) //
                                                     SAMPLED_BLOCKS))
        finally:
            os.close(fd)


def _full(folder: Path) -> None:
    assert shared_cache.damage(folder) is None


def _median(rounds: int, run: Callable[[], object], before: Callable[[], object] = lambda: None) -> float:
    times = []
    for _ in range(rounds):
        before()
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, folder: Path, fill: Callable[[Path], None], rounds: int) -> dict[str, object]:
    with published_folder(folder) as tmp:
        fill(tmp)
        record_start = time.perf_counter()
        shared_cache.record_checksums(tmp)  # published_folder records them again: timed here alone
        recorded = time.perf_counter() - record_start
    size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
    row: dict[str, object] = {"cache": name, "MB": round(size / 1e6), "record at build (warm) s": round(recorded, 3)}
    for label, check in (("size only", _sizes), ("sampled blocks", _sampled), ("full xxh3", _full)):
        row[f"{label}: warm s"] = round(_median(rounds, lambda c=check: c(folder)), 4)
        row[f"{label}: cold s"] = round(_median(rounds, lambda c=check: c(folder), lambda: _evict(folder)), 4)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workdir", help="where the caches are written (default: a temporary folder, removed)")
    args = parser.parse_args()
    harness.announce()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="gte_pro_bench_verify_"))
    rng = random.Random(0)
    try:
        rows = [measure(f"token cache, {args.rows:,} rows", work / "tokenized",
                        lambda tmp: _token_cache(tmp, args.rows, rng), args.rounds),
                measure(f"corpus store, {args.documents:,} documents", work / "corpus",
                        lambda tmp: _corpus_store(tmp, args.documents, rng), args.rounds)]
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(harness.machine())
    print(markdown_table(list(rows[0]), [list(r.values()) for r in rows], [False] + [True] * (len(rows[0]) - 1)))


if __name__ == "__main__":
    main()
