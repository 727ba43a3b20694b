"""A data module's token cache: how a row source's rows are cleaned, split into training and validation rows,
tokenized and decontaminated into the memory-mapped cache (``gte_pro.data.cache.TokenizedCache``) that training
and the pre-flight read.

The cache is keyed by the source's signature and every setting here: a later run with the same source, tokenizer
and settings opens it without reading the source again; runs and ranks that need it at once build it once
(``gte_pro.utils.shared_cache``). A source without a stable signature is tokenized once per process into a private
cache that is deleted at exit.
"""

from __future__ import annotations

import atexit
import json
import logging
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import TokenizedCache, cache_key, tokenizer_fingerprint, write_tokenized
from gte_pro.data.collaborators import EvalSetSource
from gte_pro.data.decontamination import decontaminated
from gte_pro.data.records import CleaningReport, Example, clean_required, iter_clean_examples
from gte_pro.data.row_checks import cap_validation, rows_problem
from gte_pro.data.sources import RowSource
from gte_pro.data.split import training_stream
from gte_pro.errors import DataError
from gte_pro.utils.cache import cache_root
from gte_pro.utils.files import published_folder, write_error
from gte_pro.utils.shared_cache import shared_folder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Tokenization:
    """How a text becomes token ids: the encoder's tokenizer, the truncation and the model's prompts."""

    tokenizer: PreTrainedTokenizerBase | None
    max_length: int
    query_prefix: str
    doc_prefix: str

    def require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise RuntimeError("the data module needs the encoder's tokenizer (pass tokenizer=...)")
        return self.tokenizer


@dataclass(frozen=True)
class Decontamination:
    """``data.decontaminate``: report, drop or ignore the training rows that overlap an evaluation set."""

    mode: str
    threshold: float
    num_perm: int


class TokenCache:
    """The cleaning (``min_*_chars``), the validation split (``val_fraction``, ``max_val_queries``), the cap on the
    training rows and the decontamination of one row source, tokenized with ``form`` under ``cache_dir``."""

    def __init__(self, *, form: Tokenization, min_query_chars: int, min_doc_chars: int, val_fraction: float,
                 max_val_queries: int | None, max_train_rows: int | None, cache_dir: str | None,
                 decontamination: Decontamination, eval_sets: EvalSetSource | None) -> None:
        self.form = form
        self.min_query_chars = min_query_chars
        self.min_doc_chars = min_doc_chars
        self.val_fraction = val_fraction
        self.max_val_queries = max_val_queries
        self.max_train_rows = max_train_rows
        # data.cache_dir (paths.cache_dir), else $GTE_PRO_CACHE
        self.cache_dir = str(cache_root(cache_dir))
        self.decontamination = decontamination
        self.eval_sets = eval_sets  # eval.beir: compared with the rows as the held-out split is
        self._live_reports: list[CleaningReport] = []
        self._private_cache: Path | None = None

    # --- what a row source calls while its rows are read ------------------------------------------------------
    def clean(self, rows: Iterable[Example], source: str | CleaningReport) -> Iterator[Example]:
        """The cleaned rows, lazily; the report (``source``'s, or a new one named ``source``: counts per drop
        reason) fills in as they are read."""
        report = source if isinstance(source, CleaningReport) else CleaningReport(source)
        self._live_reports.append(report)
        return iter_clean_examples(rows, report, self.min_query_chars, self.min_doc_chars)

    def clean_validation(self, rows: Iterable[Example], source: str, key: str) -> list[Example]:
        """A source's own validation rows, cleaned; none left is an error naming ``key`` (the setting that named
        them)."""
        report = CleaningReport(source)
        self.record(report)
        return clean_required(rows, report, key, self.min_query_chars, self.min_doc_chars)

    def record(self, report: CleaningReport | dict[str, Any]) -> None:
        self._live_reports.append(CleaningReport.from_dict(report) if isinstance(report, dict) else report)

    # --- the cache ----------------------------------------------------------------------------------------------
    def folder(self, source: RowSource) -> Path | None:
        """Where ``source``'s cache lives (None: the source has no stable signature)."""
        signature = source.signature(self)
        if signature is None:
            return None
        # a source without scores keeps the key it always had: existing caches stay valid
        scored = {"teacher_scores": True} if source.has_teacher_scores() else {}
        key = cache_key(scored | {
            "source": signature, "module": source.module_name,
            "tokenizer": tokenizer_fingerprint(self.form.require_tokenizer()), "max_length": self.form.max_length,
            "query_prefix": self.form.query_prefix, "doc_prefix": self.form.doc_prefix,
            "min_query_chars": self.min_query_chars, "min_doc_chars": self.min_doc_chars,
            "val_fraction": self.val_fraction, "max_val_queries": self.max_val_queries,
            "max_train_rows": self.max_train_rows,
        })
        return Path(self.cache_dir).expanduser() / "tokenized" / key

    def open(self, source: RowSource) -> tuple[TokenizedCache, dict[str, Any] | None]:
        """(``source``'s cache, built where missing; the decontamination report, None with ``off``)."""
        folder = self.folder(source)
        if folder is None:
            if self._private_cache is None:
                private = Path(tempfile.mkdtemp(prefix="gte_pro_tokens_"))
                atexit.register(shutil.rmtree, private, True)
                self._private_cache = private / "cache"
            folder = self._private_cache
            if not (folder / "meta.json").is_file():
                self._build(source, folder)
        else:  # shared with other runs and ranks: built once between them, checked (sizes, xxh3) before it is read
            folder = shared_folder(folder, lambda target: self._build(source, target), "token cache")
        # data.decontaminate: the report, and for drop the cache without the rows that overlap an evaluation set
        root = Path(self.cache_dir).expanduser() if self._private_cache is None else self._private_cache.parent
        mode, threshold, num_perm = (self.decontamination.mode, self.decontamination.threshold,
                                     self.decontamination.num_perm)
        folder, report = decontaminated(folder, root, mode, threshold, num_perm, self.eval_sets)
        return TokenizedCache(folder), report

    def _build(self, source: RowSource, folder: Path) -> None:
        form = self.form
        tokenizer = form.require_tokenizer()
        self._live_reports = []
        with published_folder(folder) as tmp:
            train, val, distractors = source.load_rows(self)
            held_out: list[Example] = []
            rows = training_stream(train, held_out if val is None else None, self.val_fraction,
                                   self.max_train_rows)
            log.info("data: tokenizing the training rows into %s", folder)
            count = write_tokenized(rows, tmp / "train.arrow", tokenizer, form.max_length, form.query_prefix,
                                    form.doc_prefix)
            val_rows = held_out if val is None else list(val)
            reports = [report.as_dict() for report in self._live_reports]
            if problem := rows_problem(source.module_name, count, len(val_rows), reports, self.val_fraction):
                raise DataError(problem)
            val_rows, distractors = cap_validation(val_rows, list(distractors), self.max_val_queries)
            meta = {"rows": count, "reports": reports, "distractors": distractors,
                    "val": [[ex.query, ex.positives, ex.negatives] for ex in val_rows]}
            try:
                (tmp / "meta.json").write_text(json.dumps(meta))
            except OSError as error:
                raise write_error(folder, error) from error
