"""A data module's batching: the order of the training rows (``EpochSampler``: length-grouped windows or uniformly
random batches), the negatives each row is given, how a batch is collated (texts, or a reranker's joined pairs)
and the resumable loader that serves them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import TokenizedCache
from gte_pro.data.collaborators import NegativePool, PairJoiner
from gte_pro.data.collate import GroupCollator, TokenCollator
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.row_checks import negatives_per_row
from gte_pro.data.sampling import EpochSampler, ResumableLoader
from gte_pro.errors import DataError


@dataclass(frozen=True)
class LoaderOptions:
    """``data.num_workers``, ``data.pin_memory``, ``data.persistent_workers``: every loader of a data module."""

    num_workers: int
    pin_memory: bool
    persistent_workers: bool

    def kwargs(self) -> dict[str, Any]:
        # persistent workers need workers: with none, DataLoader refuses the flag
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "persistent_workers": self.persistent_workers and self.num_workers > 0}


@dataclass(frozen=True)
class Batching:
    """``batch_size`` rows per device and step, each with ``num_negatives`` hard negatives (None: as many as the
    rows carry), in ``seed``'s order; ``group_by_length``: batches of similar lengths drawn from shuffled windows
    of ``length_window`` batches. ``negative_pool``: re-mined negatives (``data.remine``), drawn from once
    active; ``pair_join``: a reranker's joining of (query, document) ids (``task=rerank``)."""

    batch_size: int
    num_negatives: int | None
    group_by_length: bool
    length_window: int
    seed: int
    loader: LoaderOptions
    negative_pool: NegativePool | None
    pair_join: PairJoiner | None

    def negatives_per_row(self, cache: TokenizedCache, report: bool = True) -> int:
        """The negatives every batch row carries on ``cache``'s rows (``data.num_negatives=null``: the most of any
        row, or of a re-mined pool)."""
        remined = self.negative_pool.negatives_per_row if self.negative_pool is not None else None
        return negatives_per_row(self.num_negatives, cache.negative_counts(), report, remined)

    def sampler(self, cache: TokenizedCache, world_size: int = 1, rank: int = 0,
                batch_size: int | None = None) -> EpochSampler:
        """The training loader's batch order (the pre-flight, ``gte_pro.preflight.batch_lengths``, reads its
        batches before training: the same sampler, so the same batches)."""
        lengths = cache.lengths() if self.group_by_length else None
        return EpochSampler(len(cache), batch_size or self.batch_size, world_size, rank, self.seed, lengths,
                            self.length_window)

    def collate(self, tokenizer: PreTrainedTokenizerBase, scored: bool) -> TokenCollator:
        if self.pair_join is not None:  # task=rerank: the reranker's own joined (query, document) pairs
            return GroupCollator(tokenizer, self.pair_join, teacher_scores=scored)
        return TokenCollator(tokenizer, teacher_scores=scored)

    def check_rows(self, rows: int, world_size: int, where: str = "",
                   fix: str = "lower the batch size or add data") -> None:
        """Every step (and every rank) sees a full contrastive batch: fewer rows than one global batch is an
        error."""
        if rows < self.batch_size * world_size:
            raise DataError(f"{where}only {rows} training pairs, fewer than one global batch "
                            f"(data.batch_size={self.batch_size} x {world_size} devices): {fix}")

    def train_loader(self, cache: TokenizedCache, negatives: int, tokenizer: PreTrainedTokenizerBase,
                     world_size: int, rank: int) -> ResumableLoader:
        """Rank ``rank``'s training loader over ``cache``, ``negatives`` hard negatives a row."""
        self.check_rows(len(cache), world_size)
        pairs = TokenizedPairs(cache.token_rows(), negatives, self.seed, self.negative_pool)
        return ResumableLoader(pairs, self.sampler(cache, world_size, rank), batch_size=self.batch_size,
                               drop_last=True, collate_fn=self.collate(tokenizer, cache.scored),
                               **self.loader.kwargs())
