"""Shared caches under races and damage (issue 32, item 4): two processes that need the same token cache, corpus
store, tiny tokenizer or demo corpus at once build it once, with the bytes of a single build; a cache damaged on disk
is named in one log line and rebuilt, never read as data. The cases are scripts/cache_faults.py's (``make
reliability`` can run them too); each checks its own verdict, these tests check it and a few details more."""

from __future__ import annotations

import errno
import fcntl
import importlib.util
import json
import logging
import sys
from pathlib import Path

import pytest

from gte_pro.utils.files import published_folder

REPO = Path(__file__).resolve().parents[1]
try:
    from gte_pro.utils import shared_cache
except ImportError:  # the code before shared caches: the race and damage cases still run there (and fail)
    shared_cache = None


def _cases():
    spec = importlib.util.spec_from_file_location("cache_faults", REPO / "scripts" / "cache_faults.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["cache_faults"] = module  # the forked children look the case's functions up by module
    spec.loader.exec_module(module)
    return module


cache_faults = _cases()


def _passes(result: dict) -> str:
    assert result["ok"], result["detail"]
    return result["detail"]


def test_two_processes_build_one_token_cache_between_them():
    assert "1 build, 1 waited and reused it, bytes equal a single build" in _passes(
        cache_faults.case_token_cache_race(1))


def test_two_processes_build_one_corpus_store_between_them():
    assert "1 build, 1 waited" in _passes(cache_faults.case_corpus_store_race(2))


def test_two_processes_build_one_tiny_tokenizer_between_them():
    assert "1 build, 1 waited" in _passes(cache_faults.case_tokenizer_race(0))


def test_two_processes_build_one_demo_corpus_between_them():
    assert "1 build, 1 waited" in _passes(cache_faults.case_demo_race(0))


def test_a_damaged_token_cache_is_named_and_rebuilt():
    detail = _passes(cache_faults.case_token_cache_damage(3))
    assert "train.arrow is " in detail and "train.arrow has changed bytes" in detail  # truncated, then flipped
    assert "meta.json has changed bytes" in detail and "meta.json is missing (damaged)" in detail


def test_a_damaged_corpus_store_is_named_and_rebuilt():
    detail = _passes(cache_faults.case_corpus_store_damage(4))
    for phrase in ("tokens.bin is ", "tokens.bin has changed", "index.npy has changed", "ids.txt has changed",
                   "checksums.json is missing"):
        assert phrase in detail


def test_a_damaged_demo_corpus_is_named_and_rebuilt():
    detail = _passes(cache_faults.case_demo_damage(5))
    assert "expected" in detail and "changed bytes" in detail


def _publish(folder: Path, text: str = "rows") -> None:
    with published_folder(folder) as tmp:
        (tmp / "data.bin").write_text(text)
        (tmp / "meta.json").write_text(json.dumps({"rows": 1}))


def test_published_folders_record_each_files_size_and_checksum(tmp_path: Path):
    _publish(tmp_path / "store")
    record = json.loads((tmp_path / "store" / "checksums.json").read_text())
    assert record["algorithm"] == "xxh3_64"
    assert record["files"]["data.bin"] == {"size": 4, "xxh3": shared_cache.file_checksum(tmp_path / "store" /
                                                                                           "data.bin")}
    assert shared_cache.damage(tmp_path / "store") is None
    (tmp_path / "store" / "data.bin").write_text("rowz")  # same size, other bytes
    assert shared_cache.damage(tmp_path / "store") == \
        "data.bin has changed bytes (damaged: its xxh3 differs from the one recorded at build time)"


def test_a_sound_folder_is_hashed_once_per_process(tmp_path: Path, monkeypatch):
    folder = tmp_path / "store"
    shared_cache.shared_folder(folder, _publish, "test store")
    hashed = []
    monkeypatch.setattr(shared_cache, "damage", lambda f: hashed.append(f))
    for _ in range(3):
        assert shared_cache.shared_folder(folder, _publish, "test store") == folder
    assert hashed == []  # checked when it was built; its files have not changed since
    (folder / "data.bin").write_text("grown longer")  # a rewrite changes the size and time: checked again
    shared_cache.shared_folder(folder, _publish, "test store")
    assert hashed == [folder]


def test_without_lock_support_the_build_goes_on_and_says_so(tmp_path: Path, monkeypatch, caplog):
    def refuse(fd: int, operation: int) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    with caplog.at_level(logging.INFO, logger="gte_pro.utils.shared_cache"):
        shared_cache.shared_folder(tmp_path / "store", _publish, "test store")
    assert (tmp_path / "store" / "meta.json").is_file() and not (tmp_path / "store.lock").exists()
    assert [r.getMessage() for r in caplog.records] == [
        f"test store {tmp_path / 'store'}: the file system cannot lock {tmp_path / 'store.lock'} "
        f"(No locks available); building without the lock"]


def test_a_failed_build_releases_the_lock_and_leaves_nothing(tmp_path: Path):
    def fail(folder: Path) -> None:
        with published_folder(folder) as tmp:
            (tmp / "data.bin").write_text("half")
            raise ValueError("bad row")

    with pytest.raises(ValueError, match="bad row"):
        shared_cache.shared_folder(tmp_path / "store", fail, "test store")
    assert list(tmp_path.iterdir()) == []
    shared_cache.shared_folder(tmp_path / "store", _publish, "test store")  # the next one is not blocked
    assert (tmp_path / "store" / "meta.json").is_file()


def test_a_sealed_file_names_its_damage(tmp_path: Path):
    path = tmp_path / "blob.json"
    path.write_bytes(shared_cache.seal(b'{"a": 1}'))
    assert shared_cache.unseal(path) == (b'{"a": 1}', None)
    path.write_bytes(path.read_bytes()[:-2])
    assert shared_cache.unseal(path) == (None, "it holds 6 bytes of data, expected 8 (damaged)")
    path.write_bytes(b'{"a": 1}')  # an unsealed (older) file
    assert shared_cache.unseal(path) == (None, "its checksum header is unreadable (damaged, or written before files "
                                               "were sealed)")


def test_a_builder_killed_while_holding_the_lock_blocks_nobody(tmp_path: Path, caplog):
    import multiprocessing
    import os
    import signal
    import time

    folder = tmp_path / "store"

    def stuck(target: Path) -> None:
        with published_folder(target) as tmp:
            (tmp / "data.bin").write_text("half")
            time.sleep(60)

    child = multiprocessing.get_context("fork").Process(
        target=lambda: shared_cache.shared_folder(folder, stuck, "test store"))
    child.start()
    deadline = time.monotonic() + 30
    while not list(tmp_path.glob("store.tmp*/data.bin")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(child.pid, signal.SIGKILL)  # holding the lock, its build half-written
    child.join()
    with caplog.at_level(logging.INFO, logger="gte_pro.utils.shared_cache"):
        shared_cache.shared_folder(folder, _publish, "test store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"]  # no lock, no half build left
    assert (folder / "data.bin").read_text() == "rows"
    assert [r.getMessage() for r in caplog.records] == [
        f"test store {folder}: removed what a killed build left: store.tmp{child.pid}"]


def test_a_damaged_mining_store_is_named_and_rebuilt(tmp_path: Path, tokenizer, caplog):
    from gte_pro.mining.corpus import open_text_store

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"document number {j} of the mining corpus"}) + "\n"
                              for j in range(30)))
    folder = open_text_store([corpus], tokenizer, 16, "", tmp_path / "cache").folder
    fresh = {p.name: p.read_bytes() for p in folder.iterdir()}
    texts = bytearray((folder / "texts.bin").read_bytes())
    texts[len(texts) // 2] ^= 0x20  # one letter's case: still UTF-8, a different negative's text
    (folder / "texts.bin").write_bytes(bytes(texts))
    with caplog.at_level(logging.INFO, logger="gte_pro"):
        again = open_text_store([corpus], tokenizer, 16, "", tmp_path / "cache").folder
    assert again == folder and {p.name: p.read_bytes() for p in folder.iterdir()} == fresh
    assert [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING] == [
        f"mining corpus store {folder}: texts.bin has changed bytes (damaged: its xxh3 differs from the one recorded "
        f"at build time); rebuilding it"]


def test_a_file_where_the_cache_folder_should_be_is_replaced(tmp_path: Path, caplog):
    (tmp_path / "store").write_text("not a cache")
    with caplog.at_level(logging.WARNING, logger="gte_pro.utils.shared_cache"):
        shared_cache.shared_folder(tmp_path / "store", _publish, "test store")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store"] and (tmp_path / "store" / "meta.json").is_file()
    assert [r.getMessage() for r in caplog.records] == [
        f"test store {tmp_path / 'store'}: meta.json is missing (damaged); rebuilding it"]
