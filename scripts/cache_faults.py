"""Shared caches under races and damage: two processes that need the same cache at once, and caches damaged on disk.

    python scripts/cache_faults.py --cases all --seed 1

Race cases fork two processes that wait for each other (a barrier), then ask for the same token cache, corpus store,
tiny tokenizer or demo corpus at once; each build is slowed by 0.5 s so that they overlap. A case passes when both
processes succeed, there was one build between them, the result equals a single build in another folder byte for
byte, and no temporary or lock file is left. Damage cases build a cache, damage it (a truncated file, one flipped
byte in the middle of a file, chosen by ``--seed``), open it again and pass when the damage was named in one log line
and the cache rebuilt to the bytes of a fresh build. Each case returns {"case", "ok", "detail"}; the script exits 1
when one fails. The token and corpus cases use the packaged MiniLM tokenizer and tens of rows, the demo cases the
docstrings of one stdlib package (``email``): a few seconds each, after the imports.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import random
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

from gte_pro.modes.build_data import data_module

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script from anywhere: the checkout's package, not another install
    sys.path.insert(0, str(REPO))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # the children are forked: no tokenizer threads before

SLOW_BUILD_S = 0.5  # each build sleeps this long, so that the two processes' builds overlap


# --- helpers ---------------------------------------------------------------------------------------------------------
def _tokenizer() -> Any:
    from transformers import AutoTokenizer

    from gte_pro import packaged_minilm_path

    return AutoTokenizer.from_pretrained(packaged_minilm_path())


def _pairs_file(folder: Path, seed: int) -> Path:
    rng = random.Random(seed)
    rows = [{"query": f"what is topic number {i} ({rng.random():.6f})?",
             "positive": f"Topic {i} is a subject that covers item {rng.randrange(10**6)} in depth, with examples.",
             "negatives": [f"Unrelated passage {i}-{j} about the weather in city {rng.randrange(100)}." for j in
                           range(2)]} for i in range(60)]
    path = folder / "pairs.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _corpus_file(folder: Path, seed: int) -> Path:
    rng = random.Random(seed)
    path = folder / "corpus.jsonl"
    path.write_text("".join(json.dumps({"_id": f"d{j}", "text": f"document {j} about {rng.randrange(10**6)} and "
                                        f"{' '.join(str(rng.randrange(1000)) for _ in range(12))}"}) + "\n"
                            for j in range(200)))
    return path


def _files(folder: Path) -> dict[str, bytes]:
    """Every file under a cache folder (or the file itself), by relative path."""
    if folder.is_file():
        return {folder.name: folder.read_bytes()}
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if ".tmp" in p.name or p.name.endswith(".lock"))


def _counting(build: Callable[..., Any], log_file: Path) -> Callable[..., Any]:
    """``build``, slowed down and counted: each call appends a line to ``log_file``."""

    def counted(*args: Any, **kwargs: Any) -> Any:
        with open(log_file, "a") as handle:
            handle.write(f"{os.getpid()}\n")
        time.sleep(SLOW_BUILD_S)
        return build(*args, **kwargs)

    return counted


@contextlib.contextmanager
def _captured(name: str = "gte_pro") -> Iterator[list[str]]:
    """The log lines of ``name``'s loggers (INFO and up) while the block runs."""
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: lines.append(f"{record.levelname} {record.getMessage()}")  # type: ignore[method-assign]
    logger = logging.getLogger(name)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


def _child(get: Callable[[], Any], patch: Callable[[], None], barrier: Any, out: Path) -> None:
    """One racing process: patch its build, wait for the other, ask for the cache; report on ``out``."""
    patch()
    try:
        with _captured() as lines:
            barrier.wait(timeout=60)
            get()
        out.write_text(json.dumps({"ok": True, "log": lines}))
    except BaseException:  # noqa: BLE001 - reported to the parent, which judges
        out.write_text(json.dumps({"ok": False, "error": traceback.format_exc()}))
        os._exit(1)
    os._exit(0)


def race(work: Path, get: Callable[[], Any], patch: Callable[[], None], processes: int = 2) -> list[dict[str, Any]]:
    """Fork ``processes`` that each ``patch()`` then ``get()`` at the same moment; what each one reported."""
    context = multiprocessing.get_context("fork")  # the parent's imports are shared: no second ~10 s import
    barrier = context.Barrier(processes)
    outs = [work / f"child{n}.json" for n in range(processes)]
    children = [context.Process(target=_child, args=(get, patch, barrier, out)) for out in outs]
    for child in children:
        child.start()
    for child in children:
        child.join(timeout=120)
        if child.is_alive():
            child.kill()
    return [json.loads(out.read_text()) if out.is_file() else {"ok": False, "error": "no report"} for out in outs]


def judge_race(case: str, reports: list[dict[str, Any]], builds: Path, raced: Path, single: Path,
               root: Path) -> dict[str, Any]:
    """The race case's verdict: every process succeeded, one build, bytes equal a single build, nothing left."""
    failed = [r["error"].strip().splitlines()[-1] for r in reports if not r["ok"]]
    count = len(builds.read_text().splitlines()) if builds.is_file() else 0
    waited = sum(any("waiting" in line for line in r.get("log", [])) for r in reports)
    problems = [f"a process failed: {failed}"] if failed else []
    if count != 1:
        problems.append(f"{count} builds between {len(reports)} processes (wanted 1)")
    if not failed and _files(raced) != _files(single):
        problems.append("the raced cache differs from a single build")
    if left := _leftovers(root):
        problems.append(f"left behind: {left}")
    detail = "; ".join(problems) or f"{len(reports)} processes, 1 build, {waited} waited and reused it, " \
                                    f"bytes equal a single build"
    return {"case": case, "ok": not problems, "detail": detail}


def _flip(path: Path, rng: random.Random) -> str:
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data) // 4, 3 * len(data) // 4)
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))
    return f"flipped byte {at} of {path.name}"


def _truncate(path: Path, rng: random.Random) -> str:
    size = path.stat().st_size
    keep = rng.randrange(size // 4, 3 * size // 4)
    with open(path, "r+b") as handle:
        handle.truncate(keep)
    return f"cut {path.name} to {keep} of {size} bytes"


def judge_damage(case: str, damages: list[tuple[str, Callable[[], Path]]], folder: Path,
                 reference: dict[str, bytes], builds: Path) -> dict[str, Any]:
    """Apply each damage to a sound cache (the fresh build's bytes are put back first, so that each damage is judged
    alone), open the cache again (``reopen`` returns its folder) and check: one warning naming the folder, one
    rebuild, the bytes of a fresh build."""
    problems, done = [], []
    for what, reopen in damages:
        _restore(folder, reference)
        before = len(builds.read_text().splitlines()) if builds.is_file() else 0
        with _captured() as lines:
            try:
                reopened = reopen()
            except Exception as error:  # noqa: BLE001 - the verdict is that it failed
                problems.append(f"{what}: opening it raised {type(error).__name__}: {str(error)[:200]}")
                continue
        rebuilt = (len(builds.read_text().splitlines()) if builds.is_file() else 0) - before
        warnings = [line for line in lines if line.startswith("WARNING") and "rebuilding it" in line
                    and str(folder) in line]
        if len(warnings) != 1 or rebuilt != 1:
            problems.append(f"{what}: read as data ({len(warnings)} damage lines, {rebuilt} rebuilds)")
        elif _files(reopened) != reference:
            problems.append(f"{what}: rebuilt, but not to the bytes of a fresh build")
        else:
            done.append(f"{what}: {warnings[0].split(': ', 1)[1]}")
    return {"case": case, "ok": not problems, "detail": "; ".join(problems or done)}


def _restore(folder: Path, reference: dict[str, bytes]) -> None:
    if folder.name in reference:  # a single-file cache (the demo corpus)
        folder.write_bytes(reference[folder.name])
        return
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in reference.items():
        if not (folder / name).is_file() or (folder / name).read_bytes() != data:
            (folder / name).write_bytes(data)


def _remove(path: Path, rng: random.Random) -> str:
    del rng
    path.unlink()
    return f"removed {path.name}"


# --- token cache -----------------------------------------------------------------------------------------------------
def _token_module(train_file: Path, cache: Path) -> Any:

    return data_module("jsonl", train_file=str(train_file), tokenizer=_tokenizer(), cache_dir=str(cache),
                       val_fraction=0.2)


def _token_folder(train_file: Path, cache: Path) -> Path:
    module = _token_module(train_file, cache)
    module.prepare_data()
    return module.open_token_cache().folder


def _patch_token_build(builds: Path) -> None:
    from gte_pro.data import token_cache

    token_cache.write_tokenized = _counting(token_cache.write_tokenized, builds)


def case_token_cache_race(seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp:
        work = Path(tmp)
        train_file = _pairs_file(work, seed)
        builds = work / "builds.txt"
        reports = race(work, partial(_token_folder, train_file, work / "raced"), partial(_patch_token_build, builds))
        raced = next((work / "raced" / "tokenized").iterdir(), work / "none")
        single = _token_folder(train_file, work / "single")
        return judge_race("token_cache_race", reports, builds, raced, single, work / "raced")


def case_token_cache_damage(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp:
        work = Path(tmp)
        train_file = _pairs_file(work, seed)
        builds = work / "builds.txt"
        from gte_pro.data import token_cache

        real = token_cache.write_tokenized
        token_cache.write_tokenized = _counting(real, builds)
        try:
            folder = _token_folder(train_file, work / "cache")
            reference = _files(folder)

            def reopen(damage: Callable[[Path, random.Random], str], name: str) -> Path:
                damage(folder / name, rng)
                module = _token_module(train_file, work / "cache")
                cache = module.open_token_cache()
                len(cache.token_rows()[:])  # the rows are readable
                return cache.folder

            damages = [("truncated train.arrow", partial(reopen, _truncate, "train.arrow")),
                       ("one byte of train.arrow flipped", partial(reopen, _flip, "train.arrow")),
                       ("one byte of meta.json flipped", partial(reopen, _flip, "meta.json")),
                       ("meta.json removed", partial(reopen, _remove, "meta.json"))]
            return judge_damage("token_cache_damage", damages, folder, reference, builds)
        finally:
            token_cache.write_tokenized = real


# --- corpus store ----------------------------------------------------------------------------------------------------
def _store_folder(corpus: Path, cache: Path) -> Path:
    from gte_pro.data.beir import iter_beir_documents
    from gte_pro.data.corpus_store import open_corpus_store

    store = open_corpus_store(corpus, partial(iter_beir_documents, corpus), _tokenizer(), 32, "", cache)
    [store[j] for j in range(len(store))]  # every document's tokens are readable
    return store.folder


def _patch_store_build(builds: Path) -> None:
    from gte_pro.data import corpus_store

    corpus_store.build_corpus_store = _counting(corpus_store.build_corpus_store, builds)


def case_corpus_store_race(seed: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp:
        work = Path(tmp)
        corpus = _corpus_file(work, seed)
        builds = work / "builds.txt"
        reports = race(work, partial(_store_folder, corpus, work / "raced"), partial(_patch_store_build, builds))
        raced = next((work / "raced" / "corpora").iterdir(), work / "none")
        single = _store_folder(corpus, work / "single")
        return judge_race("corpus_store_race", reports, builds, raced, single, work / "raced")


def case_corpus_store_damage(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp:
        work = Path(tmp)
        corpus = _corpus_file(work, seed)
        builds = work / "builds.txt"
        from gte_pro.data import corpus_store

        real = corpus_store.build_corpus_store
        corpus_store.build_corpus_store = _counting(real, builds)
        try:
            folder = _store_folder(corpus, work / "cache")
            reference = _files(folder)

            def reopen(damage: Callable[[Path, random.Random], str], name: str) -> Path:
                damage(folder / name, rng)
                return _store_folder(corpus, work / "cache")

            damages = [("truncated tokens.bin", partial(reopen, _truncate, "tokens.bin")),
                       ("one byte of tokens.bin flipped", partial(reopen, _flip, "tokens.bin")),
                       ("one byte of index.npy flipped", partial(reopen, _flip, "index.npy")),
                       ("one byte of ids.txt flipped", partial(reopen, _flip, "ids.txt")),
                       ("checksums.json removed", partial(reopen, _remove, "checksums.json"))]
            return judge_damage("corpus_store_damage", damages, folder, reference, builds)
        finally:
            corpus_store.build_corpus_store = real


# --- tiny tokenizer and demo corpus ----------------------------------------------------------------------------------
def _patch_tokenizer_build(builds: Path) -> None:
    from gte_pro.models import tiny_tokenizer

    tiny_tokenizer._build = _counting(tiny_tokenizer._build, builds)


def _tiny_folder(cache: Path) -> Path:
    from gte_pro.models.tiny_tokenizer import tiny_bpe_tokenizer

    return Path(tiny_bpe_tokenizer(cache))


def case_tokenizer_race(seed: int) -> dict[str, Any]:
    del seed  # the tokenizer is fixed
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp:
        work = Path(tmp)
        builds = work / "builds.txt"
        reports = race(work, partial(_tiny_folder, work / "raced"), partial(_patch_tokenizer_build, builds))
        single = _tiny_folder(work / "single")
        return judge_race("tokenizer_race", reports, builds, work / "raced" / "models" / single.name, single,
                          work / "raced")


def _demo_file(cache: Path) -> Path:
    from gte_pro.data.demo import load_demo_splits

    splits = load_demo_splits(cache, val_fraction=0.1, max_distractors=50, min_query_chars=5, min_doc_chars=20)
    assert splits.train and splits.val
    return next(cache.glob("demo_stdlib_*.json"))


def _patch_demo_build(builds: Path) -> None:
    from gte_pro.data import demo

    demo.build_demo_splits = _counting(demo.build_demo_splits, builds)


@contextlib.contextmanager
def _small_stdlib() -> Iterator[None]:
    """The demo corpus of one stdlib package (``email``) instead of the whole library: the same build and cache,
    ~1 s instead of ~6 s (more on shared cores) per build."""
    import sysconfig

    from gte_pro.data import demo

    real = demo.stdlib_docstrings
    demo.stdlib_docstrings = partial(real, Path(sysconfig.get_paths()["stdlib"]) / "email")
    try:
        yield
    finally:
        demo.stdlib_docstrings = real


def case_demo_race(seed: int) -> dict[str, Any]:
    del seed  # the demo corpus is a function of the Python version
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp, _small_stdlib():
        work = Path(tmp)
        builds = work / "builds.txt"
        reports = race(work, partial(_demo_file, work / "raced"), partial(_patch_demo_build, builds))
        single = _demo_file(work / "single")
        raced = next((work / "raced").glob("demo_stdlib_*.json"), work / "none")
        return judge_race("demo_race", reports, builds, raced, single, work / "raced")


def case_demo_damage(seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory(prefix="cache_faults_") as tmp, _small_stdlib():
        work = Path(tmp)
        builds = work / "builds.txt"
        from gte_pro.data import demo

        real = demo.build_demo_splits
        demo.build_demo_splits = _counting(real, builds)
        try:
            path = _demo_file(work / "cache")
            reference = _files(path)

            def reopen(damage: Callable[[Path, random.Random], str]) -> Path:
                damage(path, rng)
                return _demo_file(work / "cache")

            damages = [("truncated demo file", partial(reopen, _truncate)),
                       ("one byte of the demo file flipped", partial(reopen, _flip))]
            return judge_damage("demo_damage", damages, path, reference, builds)
        finally:
            demo.build_demo_splits = real


CASES: dict[str, Callable[[int], dict[str, Any]]] = {
    "token_cache_race": case_token_cache_race,
    "token_cache_damage": case_token_cache_damage,
    "corpus_store_race": case_corpus_store_race,
    "corpus_store_damage": case_corpus_store_damage,
    "tokenizer_race": case_tokenizer_race,
    "demo_race": case_demo_race,
    "demo_damage": case_demo_damage,
}


def run_cases(names: list[str], seed: int) -> list[dict[str, Any]]:
    results = []
    for name in names:
        start = time.perf_counter()
        try:
            result = CASES[name](seed)
        except Exception:  # noqa: BLE001 - a case that crashes fails, the others still run
            result = {"case": name, "ok": False, "detail": traceback.format_exc().strip().splitlines()[-1]}
        result["seconds"] = round(time.perf_counter() - start, 1)
        print(f"{'ok  ' if result['ok'] else 'FAIL'} {name} ({result['seconds']} s): {result['detail']}", flush=True)
        results.append(result)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="all", help=f"comma-separated, or all: {', '.join(CASES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    names = list(CASES) if args.cases == "all" else args.cases.split(",")
    if unknown := [n for n in names if n not in CASES]:
        parser.error(f"unknown cases {unknown}; known: {', '.join(CASES)}")
    results = run_cases(names, args.seed)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
