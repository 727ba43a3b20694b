"""The data module, made of parts: a row source (``gte_pro.data.sources``: demo, jsonl, hf, beir), its token cache
(``gte_pro.data.token_cache``: cleaning, the validation split, tokenizing, decontamination), the batching
(``gte_pro.data.batching``: sampler, negatives, collate, loader) and the validation sets
(``gte_pro.data.validation``). ``gte_pro.modes.build_data`` builds them from a run's ``data.*`` settings; a mix of
sources (``gte_pro.data.mix``) is one data module per source under one batching."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from gte_pro.data.batching import Batching
from gte_pro.data.cache import TokenizedCache
from gte_pro.data.collaborators import CandidateSource, NegativePool
from gte_pro.data.datasets import ExampleView
from gte_pro.data.decontamination import log_report
from gte_pro.data.records import CleaningReport, Example
from gte_pro.data.row_checks import distill_problem
from gte_pro.data.sampling import EpochSampler, ResumableLoader
from gte_pro.data.sources import RowSource
from gte_pro.data.token_cache import TokenCache, Tokenization
from gte_pro.data.validation import Validation
from gte_pro.errors import DataError
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)


class TrainingPosition:
    """The training loader's position (epoch, batches done), which travels in every checkpoint. Lightning restores
    a data module before it first asks for the training loader, while its own restore of stateful loaders comes
    too late when the schedule asks for trainer.estimated_stepping_batches (which builds the loader early)."""

    _train_loader: ResumableLoader | None = None
    _resume_position: dict[str, Any] | None = None  # from a checkpoint, for the next train_dataloader()

    def _serve(self, loader: ResumableLoader) -> ResumableLoader:
        if self._resume_position is not None:
            loader.load_state_dict(self._resume_position)
            self._resume_position = None
        self._train_loader = loader
        return loader

    def state_dict(self) -> dict[str, Any]:
        return {"train_position": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = state.get("train_position")

    def next_train_epoch(self) -> int:
        """The epoch the training loader serves next (after a restore: the checkpoint's)."""
        loader = self._train_loader
        return int(loader.sampler.epoch) if loader is not None else int((self._resume_position or {}).get("epoch", 0))


class PartsView:
    """What the rest of a run reads of a data module (one source's or a mix's), answered by its parts: ``batching``,
    ``validation`` and ``form`` (the ``Tokenization`` of its texts)."""

    batching: Batching
    validation: Validation
    form: Tokenization

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.form.tokenizer

    @property
    def batch_size(self) -> int:
        return self.batching.batch_size

    @property
    def eval_batch_size(self) -> int:
        return self.validation.eval_batch_size

    @property
    def seed(self) -> int:
        return self.batching.seed

    @property
    def negative_pool(self) -> NegativePool | None:
        return self.batching.negative_pool

    @property
    def candidate_source(self) -> CandidateSource | None:
        return self.validation.candidate_source


class ContrastiveDataModule(PartsView, TrainingPosition, LightningDataModule):
    """One row source's rows, tokenized into its token cache, batched for contrastive training and validated on
    its held-out split (then on the named sets of ``validation``).

    ``prepare_data`` (local rank 0) streams the training rows once through cleaning, the validation split and the
    tokenizer into the memory-mapped token cache; ``setup`` (every rank) opens it. ``distill_loss``: the
    distillation loss that trains on these rows (``loss=distill_kl``/``margin_mse``: they need teacher scores and
    negatives, checked once the rows are read), None for any other.
    """

    # the training loader batches the token cache in train_sampler's order: the pre-flight reads those batches'
    # lengths before training (gte_pro.preflight.batch_lengths); a module that batches its own way (a mix) says False
    batches_from_train_sampler = True

    def __init__(self, source: RowSource, tokens: TokenCache, batching: Batching, validation: Validation,
                 distill_loss: str | None) -> None:
        super().__init__()
        self.source = source
        self.tokens = tokens
        self.batching = batching
        self.validation = validation
        self.distill_loss = distill_loss
        # the negatives batches carry: data.num_negatives until setup has read the token cache (null: the rows')
        self.num_negatives: int | None = batching.num_negatives
        self.token_cache: TokenizedCache | None = None
        self.retrieval: RetrievalSet | None = None
        self.reports: list[dict[str, Any]] = []
        self.decontamination: dict[str, Any] | None = None  # the report, once the cache is open

    # --- what the rest of a run reads -----------------------------------------------------------------------------
    @property
    def form(self) -> Tokenization:
        return self.tokens.form

    @property
    def max_length(self) -> int:
        return self.tokens.form.max_length

    @property
    def query_prefix(self) -> str:
        return self.tokens.form.query_prefix

    @property
    def val_fraction(self) -> float:
        """The share of the training queries held out by their hash (unless ``val_file`` names the validation)."""
        return self.tokens.val_fraction

    @property
    def val_file(self) -> str | None:
        return self.source.val_file

    @property
    def train_rows(self) -> Sequence[Example]:
        """The cleaned training rows (read from the cache on access; empty before ``setup``)."""
        return ExampleView(self.token_cache) if self.token_cache is not None else []

    # --- the token cache --------------------------------------------------------------------------------------------
    def prepare_data(self) -> None:
        # Lightning calls this on local rank 0 only, before the other ranks' setup; the cache it opens (or the
        # pre-flight opened before it: open_token_cache) is the one setup reads, not opened a second time
        if self.token_cache is None:
            self.token_cache = self._open()

    def _open(self) -> TokenizedCache:
        cache, self.decontamination = self.tokens.open(self.source)
        return cache

    def open_token_cache(self) -> TokenizedCache:
        """The training rows' token cache, built where missing, and the negatives per row it makes: what the
        pre-flight (``gte_pro.preflight.batch_lengths``) reads before the model loads; ``setup`` then reuses it."""
        if self.token_cache is None:
            self.token_cache = self._open()
            self.num_negatives = self.batching.negatives_per_row(self.token_cache, report=False)
        return self.token_cache

    def setup(self, stage: str | None = None) -> None:
        if self.retrieval is not None:
            return
        # opened once: by the pre-flight before the model loaded (open_token_cache), else here
        cache = self.token_cache if self.token_cache is not None else self._open()
        self.reports = cache.meta["reports"]
        for report in self.reports:
            log.info("%s", CleaningReport.from_dict(report).summary())
        if self.decontamination is not None:
            log_report(self.decontamination)
        val, distractors = cache.validation()
        self.token_cache = cache
        self.num_negatives = self.batching.negatives_per_row(cache)
        self._check_distillable(cache)
        self.retrieval = self.validation.held_out(cache, val, distractors)

    def _check_distillable(self, cache: TokenizedCache) -> None:
        """A distillation loss learns the teacher's scores of each row's positive and negatives: rows without
        either fail here, naming the source, before validation and training (else: at the first training step)."""
        if problem := distill_problem(self.distill_loss, self.source.where(), cache.scored, self.num_negatives):
            raise DataError(problem[0], hint=problem[1])

    # --- training ---------------------------------------------------------------------------------------------------
    def _cache(self) -> TokenizedCache:
        if self.token_cache is None:
            raise RuntimeError("setup() first")
        return self.token_cache

    def train_sampler(self, world_size: int = 1, rank: int = 0, batch_size: int | None = None) -> EpochSampler:
        """The training loader's batch order (the pre-flight reads its batches before training)."""
        return self.batching.sampler(self._cache(), world_size, rank, batch_size)

    def train_dataloader(self) -> DataLoader:
        cache = self._cache()
        trainer = self.trainer
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        assert self.num_negatives is not None
        return self._serve(self.batching.train_loader(cache, self.num_negatives, self.form.require_tokenizer(),
                                                      world_size, rank))

    # --- validation -------------------------------------------------------------------------------------------------
    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        """Named retrieval sets (e.g. BEIR folders) validated after the held-out split, each logged on its own."""
        self.validation.add_eval_sets(sets, batch_size, max_length)

    @property
    def extra_eval(self) -> list[tuple[str, RetrievalSet]]:
        """The named sets validated after the held-out split."""
        return self.validation.named_sets(self.form)

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        """(name, set) in val-dataloader order; the unnamed first one is the training data's held-out split."""
        assert self.retrieval is not None, "setup() first"
        return [("", self.retrieval), *self.extra_eval]

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        assert self.retrieval is not None, "setup() first"
        loaders = self.validation.loaders([(self.retrieval, self.eval_batch_size, self.max_length, None)], self.form)
        return loaders if len(loaders) > 1 else loaders[0]
