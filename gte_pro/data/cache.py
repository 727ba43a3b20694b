"""Tokenize once: training rows -> a memory-mapped Arrow file of token ids, reused by every later run.

A run tokenizes its training rows a chunk at a time while it streams them from the source, so building the cache
holds one chunk in memory whatever the size of the data; training then reads rows from the memory-mapped file (the
operating system pages them in and out), so a run's memory does not grow with the number of pairs. The folder name
is a hash of everything the token ids depend on (the source files' size and time, the tokenizer, ``max_length``,
prefixes, cleaning and split settings), so a changed input builds a new cache instead of reusing a stale one.

Layout of ``<cache_dir>/tokenized/<key>/``: ``train.arrow`` (Arrow stream: token ids of the query, positives and
negatives, the texts for inspection, and ``length`` = query + first positive tokens) and ``meta.json`` (row count,
cleaning reports, the held-out validation rows and distractor documents). Both are written to a temporary folder
that is renamed into place, so an interrupted build never leaves half a cache; a build that fails to write (a full
disk, a file where the folder should be) raises ``WriteError`` naming the path and the cause, and the caller
removes the temporary folder. ``checksums.json`` holds each file's size and xxh3: processes that need the same
cache at once build it once (a lock per key), and a damaged cache is rebuilt (``gte_pro.utils.shared_cache``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from transformers import PreTrainedTokenizerBase

from gte_pro.data.records import Example
from gte_pro.utils.files import writes_to
from gte_pro.utils.progress import Progress

# 2: texts are cut at 100,000 characters when cleaned (gte_pro.data.records): older caches are rebuilt
# 3: checksums.json (gte_pro.utils.shared_cache): a cache is checked before it is read
FORMAT_VERSION = 3
TOKEN_COLUMNS = ["query", "positives", "negatives"]
_IDS = pa.list_(pa.int32())
SCHEMA = pa.schema([
    ("query", _IDS), ("positives", pa.list_(_IDS)), ("negatives", pa.list_(_IDS)), ("length", pa.int32()),
    ("query_text", pa.string()), ("positive_texts", pa.list_(pa.string())), ("negative_texts", pa.list_(pa.string())),
])
# rows with teacher scores (gte_pro.data.scores) add two columns; a cache of rows without them is written exactly
# as before these existed (same schema, same bytes), and a scored source has its own cache key (ContrastiveDataModule)
SCORE_COLUMNS = ["pos_scores", "neg_scores"]
SCORED_SCHEMA = SCHEMA.append(pa.field("pos_scores", pa.list_(pa.float64()))).append(
    pa.field("neg_scores", pa.list_(pa.float64())))


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase) -> str:
    """A hash of what decides the token ids: the full tokenizer definition, not just its name."""
    digest = hashlib.sha1(f"{type(tokenizer).__name__}|{len(tokenizer)}|{tokenizer.name_or_path}".encode())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # fast tokenizers: vocabulary, normaliser, pre-tokeniser and post-processor in one JSON
        definition = json.loads(backend.to_str())
        # minus the per-call state: a call with truncation=True/max_length=... changes these two fields
        definition.pop("truncation", None)
        definition.pop("padding", None)
        digest.update(json.dumps(definition, sort_keys=True).encode())
    else:
        digest.update(json.dumps(sorted(tokenizer.get_vocab().items())).encode())
    return digest.hexdigest()


def file_signature(*paths: str | Path) -> list[Any]:
    """(absolute path, size, modification time) of each file, or of each file under a folder: cheap to compute
    on every start, and any edit of the data changes it."""
    signature: list[Any] = []
    for path in map(Path, paths):
        files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
        for file in files:
            stat = file.stat()
            signature.append([str(file.resolve()), stat.st_size, stat.st_mtime_ns])
    return signature


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha1(json.dumps({"version": FORMAT_VERSION, **parts}, sort_keys=True).encode()).hexdigest()[:16]


def _chunks(rows: Iterable[Example], size: int) -> Iterator[list[Example]]:
    chunk: list[Example] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


class _Tokenize:
    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __call__(self, texts: list[str]) -> list[list[int]]:
        if not texts:
            return []
        return self.tokenizer(texts, truncation=True, max_length=self.max_length)["input_ids"]

    def nested(self, lists: list[list[str]], prefix: str) -> list[list[list[int]]]:
        """Token ids of a list of lists of texts, tokenized as one flat batch (much faster than one call each)."""
        flat = self([prefix + text for texts in lists for text in texts])
        out, start = [], 0
        for texts in lists:
            out.append(flat[start : start + len(texts)])
            start += len(texts)
        return out


def write_tokenized(rows: Iterable[Example], path: Path, tokenizer: PreTrainedTokenizerBase, max_length: int,
                    query_prefix: str = "", doc_prefix: str = "", chunk_size: int = 2048) -> int:
    """Stream ``rows`` into an Arrow file of token ids (``chunk_size`` rows in memory at a time); returns the count.

    A failed write (a full disk, a file where the folder should be) raises ``WriteError`` naming ``path``; errors
    of reading ``rows`` propagate as they are.
    """
    tokenize = _Tokenize(tokenizer, max_length)
    progress = Progress("tokenizing", unit="rows")
    with writes_to(path):
        sink = pa.OSFile(str(path), "wb")
    count = 0
    writer = None
    try:
        for chunk in _chunks(rows, chunk_size):
            batch = _record_batch(chunk, tokenize, query_prefix, doc_prefix)
            with writes_to(path):
                if writer is None:  # the first rows decide whether the file has teacher-score columns
                    writer = pa.ipc.new_stream(sink, batch.schema)
                writer.write_batch(batch)
            count += len(chunk)
            progress.update(count)
        with writes_to(path):
            if writer is None:
                writer = pa.ipc.new_stream(sink, SCHEMA)
            writer.close()
            sink.close()
        progress.finish(count)
    finally:
        if not sink.closed:  # after a failure: release the file (the caller removes its folder)
            with contextlib.suppress(OSError):
                sink.close()
    return count


def _record_batch(chunk: list[Example], tokenize: _Tokenize, query_prefix: str, doc_prefix: str) -> pa.RecordBatch:
    queries = tokenize([query_prefix + ex.query for ex in chunk])
    positives = tokenize.nested([ex.positives for ex in chunk], doc_prefix)
    negatives = tokenize.nested([ex.negatives for ex in chunk], doc_prefix)
    lengths = [len(q) + len(p[0]) for q, p in zip(queries, positives, strict=True)]
    columns = [
        pa.array(queries, _IDS), pa.array(positives, pa.list_(_IDS)), pa.array(negatives, pa.list_(_IDS)),
        pa.array(lengths, pa.int32()), pa.array([ex.query for ex in chunk], pa.string()),
        pa.array([ex.positives for ex in chunk], pa.list_(pa.string())),
        pa.array([ex.negatives for ex in chunk], pa.list_(pa.string())),
    ]
    if chunk[0].pos_scores is None:
        return pa.record_batch(columns, schema=SCHEMA)
    columns += [pa.array([ex.pos_scores for ex in chunk], pa.list_(pa.float64())),
                pa.array([ex.neg_scores for ex in chunk], pa.list_(pa.float64()))]
    return pa.record_batch(columns, schema=SCORED_SCHEMA)


class TokenizedCache:
    """An opened cache folder: the memory-mapped rows and the metadata written with them."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.meta: dict[str, Any] = json.loads((folder / "meta.json").read_text())
        # from_file memory-maps the Arrow file: nothing is read until a row is accessed
        self.table = datasets.Dataset.from_file(str(folder / "train.arrow"))

    def __len__(self) -> int:
        return self.table.num_rows

    @property
    def scored(self) -> bool:
        """Whether the rows carry teacher scores (``pos_scores``, ``neg_scores``)."""
        return SCORE_COLUMNS[0] in self.table.column_names

    def token_rows(self) -> datasets.Dataset:
        return self.table.select_columns(TOKEN_COLUMNS + (SCORE_COLUMNS if self.scored else []))

    def lengths(self) -> np.ndarray:
        return self.table.with_format("numpy")["length"]

    def negative_counts(self) -> np.ndarray:
        """Hard negatives each row carries (read from the list offsets: no token is touched)."""
        column = self.table.data.column("negatives")
        return np.asarray(pc.list_value_length(column).to_numpy(zero_copy_only=False), dtype=np.int64)

    def example(self, index: int) -> Example:
        texts = ["query_text", "positive_texts", "negative_texts"]
        row = self.table.select_columns(texts + (SCORE_COLUMNS if self.scored else []))[index]
        return Example(row["query_text"], row["positive_texts"], row["negative_texts"], row.get("pos_scores"),
                       row.get("neg_scores"))

    def documents(self, rows: np.ndarray) -> Iterator[str]:
        """The positives, then the negatives, of each of ``rows`` (row indices) in that order, from the text columns
        (no token is touched)."""
        positives = self.table.data.column("positive_texts").take(rows).to_pylist()
        negatives = self.table.data.column("negative_texts").take(rows).to_pylist()
        for row_positives, row_negatives in zip(positives, negatives, strict=True):
            yield from row_positives
            yield from row_negatives

    def validation(self) -> tuple[list[Example], list[str]]:
        val = [Example(q, positives, negatives) for q, positives, negatives in self.meta["val"]]
        return val, self.meta["distractors"]
