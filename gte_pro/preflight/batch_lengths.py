"""The batches a run will train on, as token lengths: what the memory plan (``gte_pro.preflight.memory_budget``)
judges instead of every text at ``model.max_length``.

Before the model loads, the run's one data module (built from the tokenizer alone: no weights) opens its token
cache, built where missing, through its public ``open_token_cache``; the run then trains on that module. From it:
each row's query length and the lengths of the positive and negatives it draws
(``gte_pro.data.datasets.draw_indices``, the training dataset's own draw, epoch 0), and the batches of the training
loader's own sampler (``ContrastiveDataModule.train_sampler``: the same seed, length grouping and windows). Each
device's share of a step is a query forward and a document forward (positives, then each row's negatives), each
padded to its longest text, or cut into the encoder's length chunks (``gte_pro.models.length_chunks.chunk_plan``)
each padded to its own longest; under GradCache (``loss.mini_batch_size``) each mini-batch of rows at its own
longest (``gte_pro.training.gradcache.split_features``) is a forward of its own.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gte_pro.config.resolve import run_shape
from gte_pro.models.length_chunks import chunk_plan
from gte_pro.preflight.per_device import remines

log = logging.getLogger(__name__)

Pieces = tuple[tuple[int, int], ...]  # (texts, padded tokens) of each forward piece whose activations a step keeps


@dataclass
class DataLengths:
    """Token lengths of epoch 0's training rows as drawn, and the sampler that batches them."""

    query: np.ndarray  # (rows,) tokens of each query
    docs: np.ndarray  # (rows, 1 + k) tokens of each row's drawn positive, then of its k drawn negatives
    datamodule: Any  # a ContrastiveDataModule with its token cache open (train_sampler)
    world_size: int = 1
    chunks: int = 1  # the most length chunks of a forward (model.length_chunks on this device)
    _steps: dict[int, list[np.ndarray]] = field(default_factory=dict)

    def steps(self, batch_size: int) -> list[np.ndarray]:
        """The rows of each device's share of each step of epoch 0, at ``batch_size`` rows per device (every
        rank's shares: the largest is the per-device peak)."""
        if batch_size not in self._steps:
            sampler = self.datamodule.train_sampler(self.world_size, 0, batch_size)
            self._steps[batch_size] = [batch[rank :: self.world_size] for batch in sampler.global_batches(0)
                                       for rank in range(self.world_size)]
        return self._steps[batch_size]

    def forwards(self, rows: np.ndarray, mini_batch: int | None) -> list[np.ndarray]:
        """The text lengths of each forward whose activations are held at once for ``rows``: the query forward and
        the document forward (one group), or under GradCache each mini-batch alone (one group each)."""
        query = self.query[rows]
        docs = np.concatenate([self.docs[rows, 0], self.docs[rows, 1:].ravel()])
        if not mini_batch:
            return [query, docs]
        return [part[i : i + mini_batch] for part in (query, docs) for i in range(0, len(part), mini_batch)]

    def pieces(self, lengths: np.ndarray) -> Pieces:
        """(texts, padded tokens) of one forward over texts of ``lengths``: one block at the longest, or the
        encoder's length chunks."""
        if self.chunks <= 1:
            return ((len(lengths), int(lengths.max(initial=1))),)
        return tuple((len(rows), int(length)) for rows, length in chunk_plan(lengths, self.chunks))

    def largest(self, cost: Any, batch_size: int, mini_batch: int | None) -> tuple[Pieces, str]:
        """The pieces of the step (GradCache: the mini-batch) whose activations ``cost(pieces)`` are largest, and
        that step in words. Steps are visited by their padded-block bound, largest first, and the chunked cost
        computed only while a step's bound can still beat the largest found (chunks only lower the padding)."""
        candidates = []
        for step, rows in enumerate(self.steps(batch_size)):
            groups = ([forward] for forward in self.forwards(rows, mini_batch)) if mini_batch else [
                self.forwards(rows, None)]
            for group in groups:
                block = tuple((len(f), int(f.max(initial=1))) for f in group)
                candidates.append((cost(block), step, group))
        candidates.sort(key=lambda c: -c[0])
        best: tuple[float, Pieces, int, list[np.ndarray]] | None = None
        for bound, step, group in candidates:
            if best is not None and bound <= best[0]:
                break
            pieces = tuple(piece for forward in group for piece in self.pieces(forward))
            value = cost(pieces)
            if best is None or value > best[0]:
                best = (value, pieces, step, group)
        if best is None:
            return (), "no full batch"
        _, pieces, step, group = best
        return pieces, self._describe(step, group, mini_batch)

    def _describe(self, step: int, group: list[np.ndarray], mini_batch: int | None) -> str:
        world = f", one device's share of {self.world_size}" if self.world_size > 1 else ""
        where = f"step {step // self.world_size + 1} of epoch 0{world}"
        names = ["mini-batch"] if mini_batch else ["queries", "documents"]
        parts = []
        for name, forward in zip(names, group, strict=True):
            chunked = self.pieces(forward)
            shape = " + ".join(f"{texts}x{tokens}" for texts, tokens in chunked)
            parts.append(f"{name} {shape}")
        return f"{where}: {', '.join(parts)} texts x tokens"


def _lengths(column: pa.ChunkedArray) -> np.ndarray:
    return pc.list_value_length(column).to_numpy(zero_copy_only=False).astype(np.int64)


def _nested(column: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(lists per row, offsets of each row's first list, the tokens of every list) of a list<list<int>> column."""
    counts = _lengths(column)
    flat = _lengths(pc.list_flatten(column))
    return counts, np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64), flat


def drawn_lengths(table: pa.Table, num_negatives: int, seed: int, epoch: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(query lengths, (rows, 1 + k) lengths of each row's drawn positive and negatives) of the token cache's
    ``table``: the training dataset's draw (``draw_indices``) on the lengths, without reading the token ids."""
    from gte_pro.data.datasets import draw_indices

    query = _lengths(table.column("query"))
    pos_count, pos_start, pos_len = _nested(table.column("positives"))
    neg_count, neg_start, neg_len = _nested(table.column("negatives"))
    rows = len(query)
    docs = np.zeros((rows, 1 + num_negatives), dtype=np.int64)
    count_of = pos_count.__getitem__
    for row in range(rows):
        positive, picked, fills = draw_indices(seed, row, epoch, int(pos_count[row]), int(neg_count[row]),
                                               num_negatives, rows, count_of)
        docs[row, 0] = pos_len[pos_start[row] + positive]
        drawn = [neg_len[neg_start[row] + j] for j in picked if j is not None]
        drawn += [pos_len[pos_start[other] + j] for other, j in fills]
        docs[row, 1:] = drawn
    return query, docs


def length_chunks_of(cfg: Any, cuda: bool, padding_side: str) -> int:
    """The most length chunks of a forward as the encoder cuts them on this device (``model.length_chunks``; one
    block under ``model.compile``, left padding or FSDP, as gte_pro.models.encoder and gte_pro.launch.fsdp set it)."""
    return replace(run_shape(cfg), cuda=cuda).length_chunks(cfg.model.length_chunks, bool(cfg.model.get("compile")),
                                                            padding_side)


def batch_lengths(cfg: Any, datamodule: Any, cuda: bool) -> DataLengths | None:
    """The lengths of the run's batches (module docstring), read from ``datamodule``, the run's own data module,
    whose token cache this opens (built where missing); None where the plan judges full-length texts instead:
    ``task=rerank`` (pairs are joined per batch), a data module that batches its own way (``data=mix``: its
    ``batches_from_train_sampler`` is false), ``data.remine`` (re-mined negatives are not in the token cache)."""
    from gte_pro.data.base import ContrastiveDataModule

    if str(cfg.task) != "embed" or remines(cfg):
        return None
    if not isinstance(datamodule, ContrastiveDataModule) or not datamodule.batches_from_train_sampler:
        return None
    cache = datamodule.open_token_cache()
    query, docs = drawn_lengths(cache.token_rows().data.table, datamodule.num_negatives, datamodule.seed)
    chunks = length_chunks_of(cfg, cuda, datamodule.tokenizer.padding_side)
    return DataLengths(query, docs, datamodule, run_shape(cfg).world_size, chunks)
