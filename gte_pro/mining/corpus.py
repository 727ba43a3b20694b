"""The store of ``mine.corpus_files``: the files streamed once onto disk, so that mining never holds them whole
(``gte_pro.mining.problem.MiningCorpus`` joins it to the training rows' positives).

A store lives in ``<cache_dir>/mining_corpora/<key>/``; the key hashes everything its token ids depend on (each
file's path, size and time, the tokenizer, ``max_length``, the doc prefix), so an edited file or another model
builds a new one. It is built in a temporary folder and renamed into place. Per line of the files, in file order:

- ``tokens.bin`` + ``index.npy``: the token ids of prefix + cleaned text, as an evaluation corpus store
  (``gte_pro.data.corpus_store``: offset, token count, characters), read with positioned reads;
- ``texts.bin`` + ``texts.npy``: the cleaned texts in UTF-8, back to back, and each one's (byte offset, byte count):
  the mined file's negatives are read back from here, one positioned read each;
- ``distinct.npy``: the lines that hold a text's first occurrence, with ``hashes.npy`` (the 8-byte hash of their
  text) and ``occurrences.npy`` (how many lines hold it). Duplicates are found by sorting hashes, not with a set of
  texts, and each one is confirmed by comparing the two texts, so a hash collision cannot merge two documents.

A run opens the store on every rank: 24 bytes a line for the token index, 24 a distinct text for matching and
counting, and the documents it embeds are read from disk as its batches need them.
"""

from __future__ import annotations

import array
import json
import logging
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import cache_key, file_signature, tokenizer_fingerprint
from gte_pro.data.corpus_store import CHUNK, CorpusStore, TokenWriter, hash64, save_array
from gte_pro.data.records import MAX_TEXT_CHARS, clean_text, iter_jsonl, type_name
from gte_pro.errors import CHECK_PATH, DataError
from gte_pro.utils.files import CheckedSink, published_folder, writes_to
from gte_pro.utils.progress import Progress
from gte_pro.utils.shared_cache import shared_folder

log = logging.getLogger(__name__)


def _text_field(record: dict, key: str, where: str, required: bool) -> str:
    value = record.get(key)
    if value is None and not required:
        return ""
    if key not in record:
        raise DataError(f"{where}: field '{key}' is missing (expected {{\"text\": ...}} or a BEIR corpus line "
                        "{\"_id\", \"title\", \"text\"})")
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type_name(value)}")
    return value


def read_corpus_file(path: str | Path) -> Iterator[str]:
    """The documents of a JSON-lines corpus file: {"text"} or BEIR's {"_id", "title", "text"}, joined as BEIR
    evaluation joins them (``title + " " + text``, see ``gte_pro.data.beir``). Errors name the file, line, field."""
    for line_no, record in iter_jsonl(path):
        where = f"{path}, line {line_no}"
        if not isinstance(record, dict):
            raise DataError(f"{where}: expected a JSON object, got {type_name(record)}")
        title = _text_field(record, "title", where, required=False)
        text = _text_field(record, "text", where, required=True)
        yield f"{title} {text}".strip() if title else text


class TextStore(CorpusStore):
    """An opened mining store: the token ids of each line (``CorpusStore``), its text, and the distinct texts."""

    def __init__(self, folder: Path) -> None:
        super().__init__(folder)
        self.text_spans = np.load(folder / "texts.npy", mmap_mode="r")  # read a row at a time: not held
        self.distinct = np.load(folder / "distinct.npy")
        self.hashes = np.load(folder / "hashes.npy")
        self.occurrences = np.load(folder / "occurrences.npy")

    def text(self, line: int) -> str:
        """The cleaned text of ``line``: one positioned read, nothing kept."""
        offset, size = (int(v) for v in self.text_spans[line])
        return self.read("texts.bin", size, offset).decode("utf-8")

    def lines_of(self, texts: Sequence[str]) -> dict[int, int]:
        """{distinct line: index into ``texts``} for each of ``texts`` that the store holds."""
        order = np.argsort(self.hashes, kind="stable")
        sorted_hashes = self.hashes[order]
        found: dict[int, int] = {}
        for i, text in enumerate(texts):
            h = hash64(text)
            k = int(np.searchsorted(sorted_hashes, h))
            while k < len(order) and sorted_hashes[k] == h:  # a collision leaves several candidates: compare texts
                line = int(self.distinct[order[k]])
                if self.text(line) == text:
                    found[line] = i
                    break
                k += 1
        return found


def store_folder(files: Sequence[str | Path], tokenizer: PreTrainedTokenizerBase, max_length: int, doc_prefix: str,
                 cache_dir: str | Path) -> Path:
    key = cache_key({"mining_corpus": file_signature(*files), "tokenizer": tokenizer_fingerprint(tokenizer),
                     "max_length": max_length, "doc_prefix": doc_prefix, "store": 2})  # 2: checksums.json
    return Path(cache_dir).expanduser() / "mining_corpora" / key


def ensure_text_store(files: Sequence[str | Path], tokenizer: PreTrainedTokenizerBase, max_length: int,
                      doc_prefix: str, cache_dir: str | Path) -> Path:
    """The folder of the store of ``files`` for this tokenizer and settings, built if there is none (nothing is
    loaded: ``prepare_data`` builds, each rank's ``setup`` opens)."""
    for path in files:
        if not Path(path).is_file():
            raise DataError(f"mine.corpus_files: {path}: file not found", hint=CHECK_PATH)
    folder = store_folder(files, tokenizer, max_length, doc_prefix, cache_dir)
    # built once between processes that need it at once, checked (sizes, xxh3) before it is read
    return shared_folder(folder, lambda target: build_text_store(files, target, tokenizer, max_length, doc_prefix),
                         "mining corpus store")


def open_text_store(files: Sequence[str | Path], tokenizer: PreTrainedTokenizerBase, max_length: int,
                    doc_prefix: str, cache_dir: str | Path) -> TextStore:
    """The store of ``files`` for this tokenizer and settings, built if there is none."""
    return TextStore(ensure_text_store(files, tokenizer, max_length, doc_prefix, cache_dir))


def build_text_store(files: Sequence[str | Path], folder: Path, tokenizer: PreTrainedTokenizerBase, max_length: int,
                     doc_prefix: str = "") -> None:
    log.info("mining corpus: tokenizing %s into %s", ", ".join(map(str, files)), folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with published_folder(folder) as tmp:
        lines_per_file = _write_lines(files, tmp, tokenizer, max_length, doc_prefix)
        if not sum(lines_per_file):
            raise DataError(f"mine.corpus_files: {', '.join(map(str, files))}: no documents")
        distinct = _find_distinct(tmp)
        meta = {"lines": sum(lines_per_file), "distinct": distinct, "files": [str(f) for f in files],
                "lines_per_file": lines_per_file, "max_length": max_length, "doc_prefix": doc_prefix}
        with writes_to(tmp / "meta.json"):
            (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


def _write_lines(files: Sequence[str | Path], tmp: Path, tokenizer: PreTrainedTokenizerBase, max_length: int,
                 doc_prefix: str) -> list[int]:
    """Clean, hash, write and tokenize every line of ``files`` (one chunk of texts in memory at a time)."""
    hashes, spans = array.array("q"), array.array("q")  # 8 bytes a number, not a Python int each
    progress = Progress("tokenizing the mining corpus", None, unit="documents")
    lines_per_file, offset = [], 0
    with CheckedSink(tmp / "tokens.bin") as tokens, CheckedSink(tmp / "texts.bin") as texts:
        writer = TokenWriter(tokens, tokenizer, max_length, doc_prefix)
        chunk: list[str] = []
        for path in files:
            before = len(hashes)
            for raw in read_corpus_file(path):
                text = clean_text(raw[:MAX_TEXT_CHARS])  # as training texts are cleaned
                encoded = text.encode("utf-8")
                spans.extend((offset, len(encoded)))
                offset += len(encoded)
                hashes.append(hash64(text))
                chunk.append(text)
                if len(chunk) == CHUNK:
                    _flush(chunk, texts, writer)
                    progress.update(writer.written)
            lines_per_file.append(len(hashes) - before)
        _flush(chunk, texts, writer)
    progress.finish(len(hashes))
    save_array(tmp / "index.npy", writer.index())
    save_array(tmp / "texts.npy", np.frombuffer(spans, dtype=np.int64).reshape(-1, 2))
    save_array(tmp / "line_hashes.npy", np.frombuffer(hashes, dtype=np.int64))
    return lines_per_file


def _flush(chunk: list[str], texts: CheckedSink, writer: TokenWriter) -> None:
    """A chunk's texts (UTF-8, back to back) and token ids to their files."""
    texts.write("".join(chunk).encode("utf-8"))
    writer.write(chunk)
    chunk.clear()


def _find_distinct(tmp: Path) -> int:
    """Write ``distinct.npy``, ``hashes.npy`` and ``occurrences.npy`` from the lines' hashes (see the module doc);
    the number of distinct texts."""
    line_hashes = np.load(tmp / "line_hashes.npy")
    order = np.argsort(line_hashes, kind="stable")  # equal hashes: lines in file order
    sorted_hashes = line_hashes[order]
    starts = np.flatnonzero(np.r_[True, sorted_hashes[1:] != sorted_hashes[:-1]])
    first = order[starts].copy()  # per hash, its first line
    owner = np.repeat(first, np.diff(np.r_[starts, len(order)]))  # per sorted position, the first line of its hash
    repeated = np.flatnonzero(order != owner)
    if len(repeated):
        owner = _confirm_duplicates(tmp, order, owner, repeated)
    is_first = owner == order
    distinct = np.sort(order[is_first])
    occurrences = np.bincount(np.searchsorted(distinct, owner), minlength=len(distinct)).astype(np.int64)
    save_array(tmp / "distinct.npy", distinct)
    save_array(tmp / "hashes.npy", line_hashes[distinct])
    save_array(tmp / "occurrences.npy", occurrences)
    (tmp / "line_hashes.npy").unlink()
    return len(distinct)


def _confirm_duplicates(tmp: Path, order: np.ndarray, owner: np.ndarray, repeated: np.ndarray) -> np.ndarray:
    """``owner`` with each repeated hash checked by its text: a line whose text differs from its hash's first line
    (a collision) becomes the first of its own text."""
    spans = np.load(tmp / "texts.npy", mmap_mode="r")
    owner = owner.copy()
    with open(tmp / "texts.bin", "rb") as handle:
        def text(line: int) -> bytes:
            offset, size = (int(v) for v in spans[line])
            return os.pread(handle.fileno(), size, offset)

        first_of: dict[bytes, int] = {}
        for position in repeated.tolist():
            line, head = int(order[position]), int(owner[position])
            content = text(line)
            if content == text(head):
                continue
            first_of.setdefault(content, line)  # sorted positions keep file order within a hash
            owner[position] = first_of[content]
    return owner
