"""Full disks and unwritable paths: every writer that fails leaves the previous version byte-identical, removes its
temporary files and raises an error that names the path and the cause.

The tests run as root, where permissions block nothing: faults are an ``OSError(ENOSPC)`` injected at the
flush (where delayed allocation reports a full disk), in the middle of a write or at the final rename, and a
target whose parent folder is a regular file (``NotADirectoryError``, real even for root).
"""

from __future__ import annotations

import errno
import os
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from gte_pro.data import demo
from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.records import Example
from gte_pro.export.card import write_model_card
from gte_pro.export.writers import export_hf, export_onnx, export_sentence_transformers
from gte_pro.launch.sweep import summarize_sweep
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build_data import data_module
from gte_pro.utils import files
from gte_pro.utils.files import WriteError, write_json_atomic

FULL = "No space left on device (errno 28)"


def full_disk(*args: Any, **kwargs: Any) -> None:
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every path under ``folder`` (folders as None), with the bytes of every file."""
    return {str(p.relative_to(folder)): None if p.is_dir() else p.read_bytes() for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def tiny() -> Encoder:
    from gte_pro import packaged_minilm_path

    torch.manual_seed(0)
    return Encoder.load(packaged_minilm_path(), random_init_config={"hidden_size": 32, "num_hidden_layers": 1,
                                                                    "num_attention_heads": 2, "intermediate_size": 64})


def _sweep_summary(run: Path, encoder: Encoder) -> Path:
    summarize_sweep(run)
    return run / "summary.csv"


def _model_card(run: Path, encoder: Encoder) -> Path:
    return write_model_card(run / "model", encoder, base_model="tiny", data={"rows": 3}, loss={"name": "infonce"},
                            hyperparameters={"lr": 1e-3}, metrics_md="| a |\n|---|\n| 1 |\n")


# name -> (what it writes, given the run folder; is the target a folder)
WRITERS: dict[str, tuple[Callable[[Path, Encoder], Path], bool]] = {
    "metrics.json": (lambda run, enc: write_json_atomic(run / "metrics.json", {"val": {"val/ndcg@10": 0.5}}), False),
    "sweep summary": (_sweep_summary, False),
    "model card": (_model_card, False),
    "sentence-transformers export": (lambda run, enc: export_sentence_transformers(enc, run / "model"), True),
    "hf export": (lambda run, enc: export_hf(enc, run / "hf"), True),
    "onnx export": (lambda run, enc: export_onnx(enc, run / "model.onnx"), False),
}
TARGETS = {"metrics.json": "metrics.json", "sweep summary": "summary.csv", "model card": "model/README.md",
           "sentence-transformers export": "model", "hf export": "hf", "onnx export": "model.onnx"}


def _previous(run: Path, name: str) -> Path:
    """A previous version of the writer's target, made by hand: whatever was there must survive."""
    target = run / TARGETS[name]
    if WRITERS[name][1]:
        target.mkdir(parents=True)
        (target / "previous.txt").write_text("the previous export")
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"the previous version\n")
    if name == "sweep summary":  # one finished job, and the summary.md of before it
        (run / "summary.md").write_text("the previous summary\n")
        (run / "0" / ".hydra").mkdir(parents=True)
        (run / "0" / ".hydra" / "overrides.yaml").write_text("- model.lr=1e-3\n")
        (run / "0" / "metrics.json").write_text('{"val": {"val/ndcg@10": 0.5}, "global_step": 4}')
    return target


def _fail_at(fault: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if fault == "flush":  # everything written, the flush reports the full disk
        monkeypatch.setattr(files, "fsync_tree", full_disk)
    elif fault == "rename":  # the new version cannot take the old one's place (a folder: after the old one was
        real_replace = os.replace  # moved aside, so it must be moved back)

        def replace(src: Any, dst: Any) -> None:
            name = Path(src).name
            if f".tmp{os.getpid()}" in name and not name.endswith(".old"):
                full_disk()
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize("fault", ["flush", "rename"])
@pytest.mark.parametrize("name", list(WRITERS))
def test_a_failed_write_keeps_the_previous_version_and_names_path_and_cause(tmp_path, tiny, monkeypatch, name,
                                                                            fault):
    run = tmp_path / "run"
    run.mkdir()
    target = _previous(run, name)
    before = snapshot(run)
    write, _ = WRITERS[name]
    _fail_at(fault, monkeypatch)
    with pytest.raises(WriteError) as error:
        write(run, tiny)
    assert str(error.value) == f"could not write {target}: {FULL}; {error.value.free}"
    assert re.fullmatch(r"\d+\.\d [KMG]B free on /.*|\d+ bytes free on /.*", error.value.free)
    assert error.value.errno == errno.ENOSPC
    assert snapshot(run) == before  # byte-identical, and no temporary file or folder left


@pytest.mark.parametrize("name", [name for name in WRITERS if name != "sweep summary"])  # a sweep folder has jobs
def test_a_file_where_the_folder_should_be_is_named_in_the_error(tmp_path, tiny, name):
    run = tmp_path / "run"
    run.parent.mkdir(exist_ok=True)
    run.write_text("a file, not a folder")
    write, _ = WRITERS[name]
    with pytest.raises(OSError, match=r"could not write .*run/.*: Not a directory") as error:
        write(run, tiny)
    assert error.value.errno == errno.ENOTDIR and str(run) in str(error.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"] and run.read_text() == "a file, not a folder"


def test_a_write_that_fills_the_disk_half_way_removes_its_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "metrics.json"
    target.write_text('{"previous": true}\n')
    real_write_text = Path.write_text

    def half_then_full(self: Path, text: str, *args: Any, **kwargs: Any) -> int:
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        full_disk()
        return 0

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(WriteError, match=f"could not write {target}: No space left"):
        write_json_atomic(target, {"new": "x" * 1000})
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    assert target.read_text() == '{"previous": true}\n'


def test_an_export_that_fails_half_way_keeps_the_previous_export(tmp_path, tiny, monkeypatch):
    """The weights are already in the temporary folder when a config file hits the full disk."""
    from gte_pro.export import writers

    model = tmp_path / "model"
    export_sentence_transformers(tiny, model)
    before = snapshot(tmp_path)
    monkeypatch.setattr(writers, "_write_json", full_disk)
    with pytest.raises(WriteError, match=f"could not write {model}: No space left on device"):
        export_sentence_transformers(tiny, model)
    assert snapshot(tmp_path) == before


def test_an_error_that_is_not_an_os_error_keeps_its_type_and_names_the_path(tmp_path):
    """torch.save reports a full disk as a RuntimeError: the type stays, a note names the target."""
    target = tmp_path / "dump.pt"
    target.write_bytes(b"previous")

    def fail(tmp: Path) -> None:
        tmp.write_bytes(b"partial")
        raise RuntimeError("PytorchStreamWriter failed writing file data/0: file write failed")

    with pytest.raises(RuntimeError, match="file write failed") as error:
        files.write_atomic(target, fail)
    if sys.version_info >= (3, 11):  # exceptions take notes
        assert error.value.__notes__ == [f"could not write {target} (the previous version, if any, is unchanged)"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump.pt"] and target.read_bytes() == b"previous"


# --- caches -------------------------------------------------------------------------------------------------------
def test_a_token_cache_that_fills_the_disk_is_not_published_and_names_the_file(tmp_path, pairs_file, tokenizer,
                                                                               monkeypatch):
    import pyarrow as pa

    def make(max_length: int) -> ContrastiveDataModule:
        return data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, cache_dir=str(tmp_path / "c"),
                           val_fraction=0.2, max_length=max_length)

    make(32).prepare_data()  # an earlier cache (other settings) in the same folder
    before = snapshot(tmp_path / "c")
    real_stream = pa.ipc.new_stream

    class FullAfterOneBatch:
        """The Arrow stream writer on a disk that fills up during the first batch."""

        def __init__(self, sink: Any, schema: Any) -> None:
            self.writer = real_stream(sink, schema)

        def write_batch(self, batch: Any) -> None:
            self.writer.write_batch(batch)
            full_disk()

        def close(self) -> None:
            self.writer.close()

    monkeypatch.setattr(pa.ipc, "new_stream", FullAfterOneBatch)
    module = make(24)
    folder = module.tokens.folder(module.source)
    with pytest.raises(WriteError) as error:
        module.prepare_data()
    assert str(error.value).startswith(f"could not write {folder}.tmp") and str(error.value).endswith(
        f"/train.arrow: {FULL}; {error.value.free}")
    assert snapshot(tmp_path / "c") == before  # nothing published, no temporary folder, the other cache intact
    monkeypatch.undo()
    make(24).setup("fit")  # the next run builds it
    assert (folder / "meta.json").is_file()


def test_a_token_cache_whose_flush_fails_is_not_published(tmp_path, pairs_file, tokenizer, monkeypatch):

    module = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, cache_dir=str(tmp_path / "c"),
                         val_fraction=0.2)
    monkeypatch.setattr(files, "fsync_tree", full_disk)
    with pytest.raises(WriteError) as error:
        module.prepare_data()
    assert str(error.value) == f"could not write {module.tokens.folder(module.source)}: {FULL}; {error.value.free}"
    assert [p.name for p in (tmp_path / "c" / "tokenized").iterdir()] == []


def test_a_demo_cache_that_cannot_be_written_leaves_none(tmp_path, monkeypatch):
    splits = demo.DemoSplits([Example("q", ["p"])], [Example("v", ["w"])], ["d"], [{"source": "demo"}])
    monkeypatch.setattr(demo, "build_demo_splits", lambda **options: splits)
    cache_dir = tmp_path / "cache"
    demo.load_demo_splits(cache_dir, max_distractors=5)  # an earlier cache, other options
    before = snapshot(cache_dir)
    monkeypatch.setattr(files, "fsync_tree", full_disk)
    with pytest.raises(WriteError, match=rf"could not write {cache_dir}/demo_stdlib_py\d+_\w+\.json: No space left"):
        demo.load_demo_splits(cache_dir, max_distractors=7)
    assert snapshot(cache_dir) == before


class _FillsAfter:
    """``open`` for files.CheckedSink on a disk with ``room`` bytes left: the write that passes it fails."""

    def __init__(self, room: int) -> None:
        self.room = room

    def __call__(self, path: Path, mode: str) -> Any:
        handle, opener = open(path, mode), self  # noqa: SIM115 - closed by the sink

        class Handle:
            def write(self, data: bytes) -> int:
                opener.room -= len(data)
                if opener.room < 0:
                    full_disk()
                return handle.write(data)

            def close(self) -> None:
                handle.close()

        return Handle()


@pytest.mark.parametrize("kind", ["evaluation", "mining"])
def test_a_corpus_store_that_fills_the_disk_is_not_published_and_names_the_file(tmp_path, tokenizer, monkeypatch,
                                                                                 kind):
    from functools import partial

    from gte_pro.data import corpus_store
    from gte_pro.data.beir import iter_beir_documents
    from gte_pro.mining import corpus as mining_corpus

    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(f'{{"_id": "d{j}", "text": "document number {j} of the corpus"}}\n' for j in range(40)))
    cache = tmp_path / "cache"

    def build() -> Path:
        if kind == "mining":
            return mining_corpus.open_text_store([corpus], tokenizer, 16, "", cache).folder
        return corpus_store.open_corpus_store(corpus, partial(iter_beir_documents, corpus), tokenizer, 16, "",
                                              cache).folder

    monkeypatch.setattr(corpus_store, "CHUNK", 8)
    monkeypatch.setattr(mining_corpus, "CHUNK", 8)
    monkeypatch.setattr(files, "open", _FillsAfter(600), raising=False)  # a few chunks, then a full disk
    with pytest.raises(WriteError) as error:
        build()
    first_file = "texts.bin" if kind == "mining" else "tokens.bin"
    assert str(error.value).startswith(f"could not write {cache}/") and str(error.value).endswith(
        f".tmp{os.getpid()}/{first_file}: {FULL}; {error.value.free}")
    assert [p for p in cache.rglob("*") if p.is_file() or p.name.count(".tmp")] == []  # nothing published or left
    monkeypatch.undo()
    folder = build()  # the next run builds it
    assert (folder / "meta.json").is_file() and folder.parent.parent == cache
