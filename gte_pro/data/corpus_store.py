"""BEIR corpora for evaluation without holding them in memory: ``corpus.jsonl`` -> token ids on disk, read per rank.

``build_corpus_store`` streams ``corpus.jsonl`` once (one chunk of documents in memory at a time), tokenizes each
document as evaluation does (doc prefix, truncation at ``max_length``) and writes ``<cache_dir>/corpora/<key>/``:

- ``tokens.bin``: the int32 token ids of all documents, back to back;
- ``index.npy``: (n, 3) int64, per document its offset in tokens, its token count and its character count (what the
  longest-first batching sorts by);
- ``ids.txt``: the documents' ``_id``, one JSON string a line (scanned once per load to map the qrels' ids;
  never held whole);
- ``meta.json``: the document count and what reading noticed (cut or empty texts).

The key hashes everything the token ids depend on (the file's path, size and time, the tokenizer, ``max_length``,
the prefix), so a changed corpus or model builds a new store. It is built in a temporary folder and renamed into
place, under a lock that makes processes needing it at once build it once; each file's size and xxh3 are checked
before it is read, and a damaged store is rebuilt (``gte_pro.utils.shared_cache``). A rank reads the token ids of
the documents it embeds with positioned reads (``os.pread``), not a memory map, so its resident memory holds the
index (24 bytes a document) and its share of the embeddings, not the corpus.
"""

from __future__ import annotations

import array
import hashlib
import json
import logging
import os
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
from transformers import PreTrainedTokenizerBase

from gte_pro.data.beir import (
    BeirSet,
    beir_folder,
    beir_set,
    iter_beir_documents,
    qrels_path,
    read_beir_qrels,
    read_beir_queries,
)
from gte_pro.data.cache import cache_key, file_signature, tokenizer_fingerprint
from gte_pro.errors import CHECK_PATH, DataError
from gte_pro.utils.files import CheckedSink, published_folder, writes_to
from gte_pro.utils.progress import Progress
from gte_pro.utils.shared_cache import shared_folder

log = logging.getLogger(__name__)

CHUNK = 4096  # documents tokenized (and held in memory) at a time while building


class CorpusStore:
    """An opened store: document count, per-document token and character counts, and the token ids on demand."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.meta: dict[str, Any] = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        index = np.load(folder / "index.npy")
        self.offsets, self.lengths, self.chars = index[:, 0], index[:, 1], index[:, 2]
        self._fds: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, j: int) -> np.ndarray:
        """The token ids of document ``j``: one positioned read, nothing kept."""
        count = int(self.lengths[j])
        return np.frombuffer(self.read("tokens.bin", 4 * count, 4 * int(self.offsets[j])), dtype=np.int32)

    def read(self, name: str, size: int, offset: int) -> bytes:
        """``size`` bytes at ``offset`` of the store's file ``name``; each file is opened on first use (a DataLoader
        worker opens its own) and stays open while the store lives."""
        if name not in self._fds:
            self._fds[name] = os.open(self.folder / name, os.O_RDONLY)
            weakref.finalize(self, os.close, self._fds[name])
        return os.pread(self._fds[name], size, offset)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fds": {}}  # a file descriptor does not travel to another process

    def positions_of(self, wanted: set[str]) -> dict[str, int]:
        """Document index of each of ``wanted`` that the corpus holds (one scan of ``ids.txt``)."""
        found: dict[str, int] = {}
        with open(self.folder / "ids.txt", encoding="utf-8") as ids:
            for j, line in enumerate(ids):
                doc_id = json.loads(line)
                if doc_id in wanted:
                    found[doc_id] = j
        return found


class StoredCorpus(Sequence):
    """``RetrievalSet.corpus`` of a stored corpus: its length, and the token ids of each document (no text).
    ``source``: the corpus file and its reader, from which ``tokens_for`` stores the same documents for another
    tokenizer (a reranker's retriever)."""

    def __init__(self, store: CorpusStore, source: tuple[Path, Documents] | None = None) -> None:
        self.store = store
        self.source = source

    def tokens_for(self, tokenizer: PreTrainedTokenizerBase, max_length: int, doc_prefix: str) -> CorpusStore:
        """The same documents, in the same order, tokenized for another model: a store beside this one."""
        if self.source is None:
            raise TypeError(f"the corpus of {self.store.folder} does not name its source file")
        corpus_file, documents = self.source
        return open_corpus_store(corpus_file, documents, tokenizer, max_length, doc_prefix,
                                 self.store.folder.parent.parent)  # <cache_dir>/corpora/<key>

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, j: Any) -> Any:
        raise TypeError(f"the corpus of {self.store.folder} is kept as token ids on disk: no text to return")


def store_folder(corpus_file: Path, tokenizer: PreTrainedTokenizerBase, max_length: int, doc_prefix: str,
                 cache_dir: str | Path) -> Path:
    key = cache_key({"corpus": file_signature(corpus_file), "tokenizer": tokenizer_fingerprint(tokenizer),
                     "max_length": max_length, "doc_prefix": doc_prefix, "store": 2})  # 2: checksums.json
    return Path(cache_dir).expanduser() / "corpora" / key


# (line number, id, text) per document of a corpus file, counting what reading changed in the Counter
Documents = Callable[[Counter], Iterator[tuple[int, str, str]]]


def open_corpus_store(corpus_file: Path, documents: Documents, tokenizer: PreTrainedTokenizerBase, max_length: int,
                      doc_prefix: str, cache_dir: str | Path) -> CorpusStore:
    """The store of ``corpus_file`` (read by ``documents``) for this tokenizer and settings, built if there is
    none."""
    folder = store_folder(corpus_file, tokenizer, max_length, doc_prefix, cache_dir)
    # built once between processes that need it at once, checked (sizes, xxh3) before it is read
    shared_folder(folder, lambda target: build_corpus_store(corpus_file, documents, target, tokenizer, max_length,
                                                            doc_prefix), "corpus store")
    return CorpusStore(folder)


def hash64(text: str) -> int:
    """An 8-byte hash of ``text``: stores find repeated ids or texts by sorting these, not with a set of strings."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little", signed=True)


def _check_unique(corpus_file: Path, documents: Documents, hashes: np.ndarray) -> None:
    """Duplicate ids, found among 8-byte hashes (not a set of all ids); a repeated hash is confirmed by a second
    scan that names both lines."""
    ordered = np.sort(hashes)
    repeated = set(ordered[1:][ordered[1:] == ordered[:-1]].tolist())
    if not repeated:
        return
    first_line: dict[str, int] = {}
    for line_no, doc_id, _ in documents(Counter()):
        if hash64(doc_id) in repeated:
            if doc_id in first_line:
                raise DataError(f"{corpus_file}, line {line_no}: duplicate _id '{doc_id}' "
                                f"(first on line {first_line[doc_id]})")
            first_line[doc_id] = line_no


def build_corpus_store(corpus_file: Path, documents: Documents, folder: Path, tokenizer: PreTrainedTokenizerBase,
                       max_length: int, doc_prefix: str = "") -> None:
    """Stream ``corpus_file`` into a store at ``folder`` (see the module's docstring)."""
    log.info("corpus: tokenizing %s into %s", corpus_file, folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    with published_folder(folder) as tmp:
        count, anomalies = _write_store(corpus_file, documents, tmp, tokenizer, max_length, doc_prefix)
        if not count:
            raise DataError(f"{corpus_file}: no documents")
        meta = {"documents": count, "anomalies": dict(anomalies), "corpus": str(corpus_file),
                "max_length": max_length, "doc_prefix": doc_prefix}
        with writes_to(tmp / "meta.json"):
            (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")


def save_array(path: Path, values: np.ndarray) -> None:
    with writes_to(path):
        np.save(path, values)


class TokenWriter:
    """Tokenizes documents a chunk at a time into an open ``tokens.bin`` and keeps their index rows (offset in
    tokens, token count, characters with the prefix): what a store's ``index.npy`` holds."""

    def __init__(self, tokens: CheckedSink, tokenizer: PreTrainedTokenizerBase, max_length: int, prefix: str) -> None:
        self.tokens, self.tokenizer, self.max_length, self.prefix = tokens, tokenizer, max_length, prefix
        self.parts: list[np.ndarray] = []
        self.offset = 0

    def write(self, texts: Sequence[str]) -> None:
        if not texts:
            return
        rows = self.tokenizer([self.prefix + text for text in texts], truncation=True,
                              max_length=self.max_length)["input_ids"]
        counts = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        self.tokens.write(np.concatenate([np.asarray(r, dtype=np.int32) for r in rows]).tobytes())
        chars = np.fromiter((len(self.prefix) + len(text) for text in texts), dtype=np.int64, count=len(rows))
        self.parts.append(np.stack([self.offset + np.cumsum(counts) - counts, counts, chars], axis=1))
        self.offset += int(counts.sum())

    @property
    def written(self) -> int:
        return sum(len(part) for part in self.parts)

    def index(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else np.empty((0, 3), dtype=np.int64)


def _write_store(corpus_file: Path, documents: Documents, tmp: Path, tokenizer: PreTrainedTokenizerBase,
                 max_length: int, doc_prefix: str) -> tuple[int, Counter]:
    anomalies: Counter = Counter()
    hashes = array.array("q")  # 8 bytes a document, not a Python int each
    progress = Progress("tokenizing documents", None, unit="documents")
    with CheckedSink(tmp / "tokens.bin") as tokens, CheckedSink(tmp / "ids.txt") as ids:
        writer = TokenWriter(tokens, tokenizer, max_length, doc_prefix)
        chunk: list[tuple[str, str]] = []

        def flush() -> None:
            writer.write([text for _, text in chunk])
            ids.write("".join(json.dumps(doc_id) + "\n" for doc_id, _ in chunk).encode())  # any id, line breaks too
            chunk.clear()
            progress.update(writer.written)

        for _, doc_id, text in documents(anomalies):
            chunk.append((doc_id, text))
            hashes.append(hash64(doc_id))
            if len(chunk) == CHUNK:
                flush()
        flush()
    progress.finish(len(hashes))
    _check_unique(corpus_file, documents, np.frombuffer(hashes, dtype=np.int64))
    save_array(tmp / "index.npy", writer.index())
    return len(hashes), anomalies


def load_beir_stored(folder: str | Path, split: str, name: str | None, tokenizer: PreTrainedTokenizerBase,
                     max_length: int, doc_prefix: str, cache_dir: str | Path) -> BeirSet:
    """``load_beir`` for corpora of any size: the corpus is tokenized once into a store on disk
    (``gte_pro.data.corpus_store``) and the set's ``corpus`` gives its length and token ids, no texts; only the
    queries and the qrels are held in memory. The same checks and errors as ``load_beir``."""
    folder = beir_folder(folder)
    qrels_path(folder, split)
    if not (folder / "corpus.jsonl").is_file():
        raise DataError(f"{folder / 'corpus.jsonl'}: file not found", hint=CHECK_PATH)
    corpus_file = folder / "corpus.jsonl"
    store = open_corpus_store(corpus_file, partial(iter_beir_documents, corpus_file), tokenizer, max_length,
                              doc_prefix, cache_dir)
    anomalies: Counter = Counter(store.meta["anomalies"])
    queries = read_beir_queries(folder)
    qrels = read_beir_qrels(folder, split, queries, None, anomalies)
    index = store.positions_of({doc for judged in qrels.values() for doc in judged})
    read_beir_qrels(folder, split, queries, index)  # raises on the first line whose corpus-id the corpus lacks
    return beir_set(folder, split, name, queries, qrels, index,
                    StoredCorpus(store, (corpus_file, partial(iter_beir_documents, corpus_file))), anomalies, [])
