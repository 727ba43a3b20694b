"""What a data module serves besides training batches: its validation sets (the held-out split first, then the
named ``eval.beir`` sets) as loaders of token ids for an embedder, or, for a reranker (``task=rerank``), of each
query's candidate pairs; and how a training batch is collated (texts, or a reranker's joined pairs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from gte_pro.data.collaborators import CandidateSource, EvalSetSource, PairJoiner
from gte_pro.data.collate import CandidateCollator, EvalCollator, GroupCollator, TokenCollator
from gte_pro.data.datasets import CandidatePairs, EvalTextsCache
from gte_pro.retrieval import RetrievalSet


class ValidationSets:
    """Mixed into the data modules (``gte_pro.data.base``), which provide ``retrieval`` (the held-out split),
    ``tokenizer``, the prefixes, ``num_workers``, ``pin_memory`` and ``persistent_workers``."""

    retrieval: RetrievalSet | None
    tokenizer: PreTrainedTokenizerBase | None

    def init_validation_sets(self, eval_batch_size: int, max_length: int, pair_join: PairJoiner | None = None,
                             candidates: CandidateSource | None = None,
                             eval_sets: EvalSetSource | None = None) -> None:
        # named sets validated after the held-out split (eval.beir: ``eval_sets``, loaded when first needed)
        self._extra_eval: list[tuple[str, RetrievalSet]] = []
        self._eval_set_source = eval_sets
        self.extra_eval_batch_size = eval_batch_size
        self.extra_eval_max_length = max_length
        self._eval_texts = EvalTextsCache()
        # task=rerank: training batches are the rows' (query, document) pairs joined by the reranker's own
        # ``pair_join`` (gte_pro.models.pairs.PairBatcher), and each validation set is served as its queries'
        # candidate pairs (``candidates``, found by the reranker's module); both are handed in by gte_pro.modes.build
        self.pair_join = pair_join
        self.candidate_source = candidates

    def train_collate(self, tokenizer: PreTrainedTokenizerBase, scored: bool) -> TokenCollator:
        if self.pair_join is not None:
            return GroupCollator(tokenizer, self.pair_join, teacher_scores=scored)
        return TokenCollator(tokenizer, teacher_scores=scored)

    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        """Named retrieval sets (e.g. BEIR folders) validated after the held-out split, each logged on its own."""
        self._extra_eval = list(sets)
        self.extra_eval_batch_size = batch_size or self.eval_batch_size
        self.extra_eval_max_length = max_length or self.max_length

    @property
    def extra_eval(self) -> list[tuple[str, RetrievalSet]]:
        """The named sets (``eval_sets``, loaded here the first time they are asked for)."""
        if self._eval_set_source is not None:
            source, self._eval_set_source = self._eval_set_source, None
            self.add_eval_sets(source.load(self.tokenizer, self.doc_prefix, self.max_length), source.batch_size,
                               source.max_length)
        return self._extra_eval

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        """(name, set) in val-dataloader order; the unnamed first one is the training data's held-out split."""
        assert self.retrieval is not None, "setup() first"
        return [("", self.retrieval), *self.extra_eval]

    def eval_loader(self, index: int, retrieval: RetrievalSet, batch_size: int, max_length: int,
                    query_prefix: str | None = None) -> DataLoader:
        """The loader of validation set ``index``; ``query_prefix``: the set's own (a mix's source), else ours."""
        prefix = self.query_prefix if query_prefix is None else query_prefix
        texts = self._eval_texts.get(self.tokenizer, retrieval, max_length, prefix, self.doc_prefix)
        if self.candidate_source is not None:  # task=rerank: (query, candidate) pairs instead of texts
            assert self.pair_join is not None, "a reranker's validation needs its pair_join"
            items: Any = CandidatePairs(texts, self.candidate_source.candidates(index))
            collate: Any = CandidateCollator(self.pair_join)
        else:
            items, collate = texts, EvalCollator(self.tokenizer)
        return DataLoader(items, batch_size=batch_size, collate_fn=collate, num_workers=self.num_workers,
                          pin_memory=self.pin_memory, persistent_workers=self.persistent_workers)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        main, *extra = self.validation_sets()
        loaders = [self.eval_loader(0, main[1], self.eval_batch_size, self.max_length)]
        loaders += [self.eval_loader(index, rs, self.extra_eval_batch_size, self.extra_eval_max_length)
                    for index, (_, rs) in enumerate(extra, start=1)]
        return loaders if extra else loaders[0]
