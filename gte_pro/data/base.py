"""The base Lightning data module: cleaning, the validation split, the token cache, batching and validation sets.
Subclasses (one file per source: ``demo``, ``jsonl``, ``hf``, ``beir``) only say where the rows come from."""

from __future__ import annotations

import abc
import atexit
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import TokenizedCache, cache_key, tokenizer_fingerprint, write_tokenized
from gte_pro.data.collaborators import CandidateSource, EvalSetSource, NegativePool, PairJoiner
from gte_pro.data.datasets import ExampleView, TokenizedPairs
from gte_pro.data.decontamination import decontaminated, log_report
from gte_pro.data.records import CleaningReport, Example, iter_clean_examples
from gte_pro.data.row_checks import cap_validation, distill_problem, negatives_per_row, rows_problem
from gte_pro.data.sampling import EpochSampler, ResumableLoader
from gte_pro.data.split import training_stream
from gte_pro.data.validation import ValidationSets, held_out_set
from gte_pro.errors import DataError
from gte_pro.retrieval import RetrievalSet
from gte_pro.utils.cache import cache_root
from gte_pro.utils.files import published_folder, write_error
from gte_pro.utils.shared_cache import shared_folder

log = logging.getLogger(__name__)


class ContrastiveDataModule(ValidationSets, LightningDataModule, abc.ABC):
    """Base: subclasses implement ``load_rows`` and ``source_signature``.

    ``prepare_data`` (local rank 0) streams the training rows once through cleaning, the validation split and the
    tokenizer into a memory-mapped token cache (``gte_pro.data.cache``); ``setup`` (every rank) opens it. A later
    run with the same source, tokenizer and settings starts from the cache without reading the source again.
    """

    # the training loader batches the token cache in train_sampler's order: the pre-flight reads those batches'
    # lengths before training (gte_pro.preflight.batch_lengths); a module that batches its own way (a mix) says False
    batches_from_train_sampler = True

    def __init__(
        self,
        *,
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 128,
        num_negatives: int | None = None,
        max_length: int = 256,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        val_fraction: float = 0.05,
        max_val_queries: int | None = 1000,
        val_distractors: int | None = 10000,
        max_train_rows: int | None = None,
        min_query_chars: int = 3,
        min_doc_chars: int = 10,
        query_prefix: str = "",
        doc_prefix: str = "",
        seed: int = 42,
        cache_dir: str | None = None,
        group_by_length: bool = True,
        length_window: int = 50,
        remine: Any = None,  # data.remine: read by the training loop (gte_pro.mining.remine), not here
        negative_pool: NegativePool | None = None,  # re-mined negatives (data.remine), drawn from once active
        pair_join: PairJoiner | None = None,  # task=rerank: the reranker's joining of (query, document) ids
        candidates: CandidateSource | None = None,  # task=rerank: each validation set's candidates
        eval_sets: EvalSetSource | None = None,  # eval.beir: named sets validated after the held-out split
        distill_loss: str | None = None,  # loss=distill_kl/margin_mse trains on these rows: scores and negatives
        decontaminate: str = "report",  # data.decontaminate: the overlap with the evaluation sets (decontamination)
        decontaminate_threshold: float = 0.8,
        decontaminate_num_perm: int = 128,
    ) -> None:
        super().__init__()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        # data.num_negatives as set (None: as many as the rows carry); num_negatives is what batches carry, known
        # once setup has read the token cache
        self.num_negatives_setting = num_negatives
        self.num_negatives: int | None = num_negatives
        self.max_length = max_length
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.val_fraction = val_fraction
        self.max_val_queries = max_val_queries
        self.val_distractors = val_distractors
        self.max_train_rows = max_train_rows
        self.min_query_chars = min_query_chars
        self.min_doc_chars = min_doc_chars
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix
        self.seed = seed
        # where the token cache (and the demo corpus) live: data.cache_dir (paths.cache_dir), else $GTE_PRO_CACHE
        self.cache_dir = str(cache_root(cache_dir))
        self.group_by_length = group_by_length
        self.length_window = length_window
        self.token_cache: TokenizedCache | None = None
        self.retrieval: RetrievalSet | None = None
        self.reports: list[dict[str, Any]] = []
        self._live_reports: list[CleaningReport] = []
        self._private_cache: Path | None = None
        self.init_validation_sets(eval_batch_size, max_length, pair_join, candidates, eval_sets)
        self._train_loader: ResumableLoader | None = None
        self._resume_position: dict[str, Any] | None = None  # from a checkpoint, for the next train_dataloader()
        self.negative_pool = negative_pool
        # loss=distill_kl/margin_mse: the rows need teacher scores and negatives (checked once the rows are read)
        self.distill_loss = distill_loss
        self.decontamination_options = (decontaminate, decontaminate_threshold, decontaminate_num_perm)
        self.decontaminate_sets = eval_sets  # eval.beir, compared with the rows as the held-out split is
        self.decontamination: dict[str, Any] | None = None  # the report, once the cache is open

    # --- what subclasses provide -------------------------------------------------------------------------
    @abc.abstractmethod
    def load_rows(self) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        """(training rows, validation rows or None to split them off the training rows, distractor documents).

        The training rows may be a generator: they are streamed once into the token cache, never held in memory.
        """

    def source_signature(self) -> Any:
        """A JSON-able value that changes whenever the source's rows do (e.g. ``cache.file_signature`` of the
        files): part of the token cache's key. None: no stable identity; the rows are tokenized once per process
        into a private cache that is deleted at exit."""
        return None

    def has_teacher_scores(self) -> bool:
        """Whether the source's rows carry teacher scores (``gte_pro.data.scores``): then the token cache's key
        says so, so that a cache built before scores were read (or from the rows without them) is not reused."""
        return False

    # --- shared logic ---------------------------------------------------------------------------------------
    def _clean(self, rows: Iterable[Example], source: str) -> Iterator[Example]:
        """The cleaned rows, lazily; the report (counts per drop reason) fills in as they are read."""
        report = CleaningReport(source)
        self._live_reports.append(report)
        return iter_clean_examples(rows, report, self.min_query_chars, self.min_doc_chars)

    def _record(self, report: CleaningReport | dict[str, Any]) -> None:
        self._live_reports.append(CleaningReport.from_dict(report) if isinstance(report, dict) else report)

    @property
    def train_rows(self) -> Sequence[Example]:
        """The cleaned training rows (read from the cache on access; empty before ``setup``)."""
        return ExampleView(self.token_cache) if self.token_cache is not None else []

    def _cache_folder(self) -> Path | None:
        signature = self.source_signature()
        if signature is None:
            return None
        tokenizer = self._require_tokenizer()
        # a source without scores keeps the key it always had: existing caches stay valid
        scored = {"teacher_scores": True} if self.has_teacher_scores() else {}
        key = cache_key(scored | {
            "source": signature, "module": type(self).__name__, "tokenizer": tokenizer_fingerprint(tokenizer),
            "max_length": self.max_length, "query_prefix": self.query_prefix, "doc_prefix": self.doc_prefix,
            "min_query_chars": self.min_query_chars, "min_doc_chars": self.min_doc_chars,
            "val_fraction": self.val_fraction, "max_val_queries": self.max_val_queries,
            "max_train_rows": self.max_train_rows,
        })
        return Path(self.cache_dir).expanduser() / "tokenized" / key

    def _ensure_cache(self) -> Path:
        folder = self._cache_folder()
        if folder is None:
            if self._private_cache is None:
                private = Path(tempfile.mkdtemp(prefix="gte_pro_tokens_"))
                atexit.register(shutil.rmtree, private, True)
                self._private_cache = private / "cache"
            folder = self._private_cache
            if not (folder / "meta.json").is_file():
                self._build_cache(folder)
        else:  # shared with other runs and ranks: built once between them, checked (sizes, xxh3) before it is read
            folder = shared_folder(folder, self._build_cache, "token cache")
        # data.decontaminate: the report, and for drop the cache without the rows that overlap an evaluation set
        root = Path(self.cache_dir).expanduser() if self._private_cache is None else self._private_cache.parent
        folder, self.decontamination = decontaminated(folder, root, *self.decontamination_options,
                                                      self.decontaminate_sets)
        return folder

    def prepare_data(self) -> None:
        self._ensure_cache()  # Lightning calls this on local rank 0 only, before the other ranks' setup

    def _build_cache(self, folder: Path) -> None:
        tokenizer = self._require_tokenizer()
        self._live_reports = []
        with published_folder(folder) as tmp:
            train, val, distractors = self.load_rows()
            held_out: list[Example] = []
            rows = training_stream(train, held_out if val is None else None, self.val_fraction,
                                   self.max_train_rows)
            log.info("data: tokenizing the training rows into %s", folder)
            count = write_tokenized(rows, tmp / "train.arrow", tokenizer, self.max_length, self.query_prefix,
                                    self.doc_prefix)
            val_rows = held_out if val is None else list(val)
            reports = [report.as_dict() for report in self._live_reports]
            if problem := rows_problem(type(self).__name__, count, len(val_rows), reports, self.val_fraction):
                raise DataError(problem)
            val_rows, distractors = cap_validation(val_rows, list(distractors), self.max_val_queries)
            meta = {"rows": count, "reports": reports, "distractors": distractors,
                    "val": [[ex.query, ex.positives, ex.negatives] for ex in val_rows]}
            try:
                (tmp / "meta.json").write_text(json.dumps(meta))
            except OSError as error:
                raise write_error(folder, error) from error

    def setup(self, stage: str | None = None) -> None:
        if self.retrieval is not None:
            return
        # opened once: by the pre-flight before the model loaded (open_token_cache), else here
        cache = self.token_cache if self.token_cache is not None else TokenizedCache(self._ensure_cache())
        self.reports = cache.meta["reports"]
        for report in self.reports:
            log.info("%s", CleaningReport.from_dict(report).summary())
        if self.decontamination is not None:
            log_report(self.decontamination)
        val, distractors = cache.validation()
        self.token_cache = cache
        self.num_negatives = self._negatives_per_row(cache)
        self._check_distillable(cache)
        self.retrieval = held_out_set(cache, val, distractors, self.val_distractors)

    def _check_distillable(self, cache: TokenizedCache) -> None:
        """A distillation loss learns the teacher's scores of each row's positive and negatives: rows without
        either fail here, naming the source, before validation and training (else: at the first training step)."""
        source = getattr(self, "train_file", None) or getattr(self, "path", None) or type(self).__name__
        if problem := distill_problem(self.distill_loss, source, cache.scored, self.num_negatives):
            raise DataError(problem[0], hint=problem[1])

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise RuntimeError("the data module needs the encoder's tokenizer (pass tokenizer=...)")
        return self.tokenizer

    def train_dataloader(self) -> DataLoader:
        if self.token_cache is None:
            raise RuntimeError("setup() first")
        trainer = self.trainer
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        if len(self.token_cache) < self.batch_size * world_size:
            raise DataError(f"only {len(self.token_cache)} training pairs, fewer than one global batch "
                            f"(data.batch_size={self.batch_size} x {world_size} devices): lower the batch size or "
                            "add data")
        pairs = TokenizedPairs(self.token_cache.token_rows(), self.num_negatives, self.seed, self.negative_pool)
        collate = self.train_collate(self._require_tokenizer(), self.token_cache.scored)
        sampler = self.train_sampler(world_size, rank)
        # every step (and every rank) sees a full contrastive batch with the same number of negatives
        loader = ResumableLoader(pairs, sampler, batch_size=self.batch_size, drop_last=True, collate_fn=collate,
                                 num_workers=self.num_workers, pin_memory=self.pin_memory,
                                 persistent_workers=self.persistent_workers)
        if self._resume_position is not None:
            loader.load_state_dict(self._resume_position)
            self._resume_position = None
        self._train_loader = loader
        return loader

    def _negatives_per_row(self, cache: TokenizedCache, report: bool = True) -> int:
        remined = self.negative_pool.negatives_per_row if self.negative_pool is not None else None
        return negatives_per_row(self.num_negatives_setting, cache.negative_counts(), report, remined)

    def open_token_cache(self) -> TokenizedCache:
        """The training rows' token cache, built where missing, and the negatives per row it makes: what the
        pre-flight (``gte_pro.preflight.batch_lengths``) reads before the model loads; ``setup`` then reuses it."""
        if self.token_cache is None:
            self.token_cache = TokenizedCache(self._ensure_cache())
            self.num_negatives = self._negatives_per_row(self.token_cache, report=False)
        return self.token_cache

    def train_sampler(self, world_size: int = 1, rank: int = 0, batch_size: int | None = None) -> EpochSampler:
        """The training loader's batch order (the pre-flight, ``gte_pro.preflight.batch_lengths``, reads its batches
        before training: the same sampler, so the same batches)."""
        if self.token_cache is None:
            raise RuntimeError("setup() first")
        lengths = self.token_cache.lengths() if self.group_by_length else None
        return EpochSampler(len(self.token_cache), batch_size or self.batch_size, world_size, rank, self.seed, lengths,
                            self.length_window)

    # the training position (epoch, batches done) travels in every checkpoint. Lightning restores a data module
    # before it first asks for the training loader, while its own restore of stateful loaders comes too late when
    # the schedule asks for trainer.estimated_stepping_batches (which builds the loader early)
    def state_dict(self) -> dict[str, Any]:
        return {"train_position": self._train_loader.state_dict()} if self._train_loader is not None else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._resume_position = state.get("train_position")

    def next_train_epoch(self) -> int:
        """The epoch the training loader serves next (after a restore: the checkpoint's)."""
        loader = self._train_loader
        return int(loader.sampler.epoch) if loader is not None else int((self._resume_position or {}).get("epoch", 0))
