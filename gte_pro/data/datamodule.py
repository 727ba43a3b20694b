"""Lightning data modules: where the (query, positive[, negatives]) rows come from, and how they are batched.

One base class does batching (dynamic padding: each batch is padded to its own longest text, never to
``max_length``), cleaning, splitting and the retrieval validation set; subclasses only say where rows come from.
"""

from __future__ import annotations

import abc
import atexit
import json
import logging
import os
import random
import shutil
import sys
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset, Sampler
from transformers import PreTrainedTokenizerBase

from gte_pro.data.cache import (
    TokenizedCache,
    cache_key,
    file_signature,
    publish,
    temporary_folder,
    tokenizer_fingerprint,
    write_tokenized,
)
from gte_pro.data.demo import load_demo_splits, split_bucket
from gte_pro.data.records import (
    CleaningReport,
    DataError,
    Example,
    iter_clean_examples,
    iter_pairs_jsonl,
    parse_record,
)
from gte_pro.evaluation import RetrievalSet

log = logging.getLogger(__name__)


class PairCollator:
    """Tokenizes queries and documents (positives, then the negatives of each row in order) separately."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int, query_prefix: str = "",
                 doc_prefix: str = "") -> None:
        self.tokenizer = tokenizer
        self.max_length = max_length
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix

    def _tokenize(self, texts: list[str]) -> dict[str, torch.Tensor]:
        return dict(self.tokenizer(texts, padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt"))

    def __call__(self, rows: list[tuple[str, str, list[str]]]) -> dict[str, Any]:
        queries = [self.query_prefix + q for q, _, _ in rows]
        docs = [self.doc_prefix + p for _, p, _ in rows]
        docs += [self.doc_prefix + n for _, _, negatives in rows for n in negatives]
        query, doc = self._tokenize(queries), self._tokenize(docs)
        real_tokens = int(query["attention_mask"].sum()) + int(doc["attention_mask"].sum())
        return {"query": query, "doc": doc, "num_negatives": len(rows[0][2]), "num_tokens": real_tokens}


class TokenizedPairs(Dataset):
    """Rows of the token cache -> (query ids, positive ids, k negatives' ids), drawn afresh each epoch.

    Missing hard negatives are filled with other rows' positives. ``__getitems__`` lets the DataLoader fetch a
    whole batch in one read of the memory-mapped table.
    """

    def __init__(self, rows: Any, num_negatives: int, seed: int) -> None:
        self.rows = rows  # a datasets.Dataset with the TOKEN_COLUMNS, memory-mapped
        self.num_negatives = num_negatives
        self.seed = seed
        self._visits = np.zeros(len(rows), dtype=np.int32)  # each epoch draws other positives/negatives

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> tuple[list[int], list[int], list[list[int]]]:
        return self.__getitems__([index])[0]

    def __getitems__(self, indices: list[int]) -> list[tuple[list[int], list[int], list[list[int]]]]:
        fetched = self.rows[list(indices)]
        items = []
        for query, positives, pool, index in zip(fetched["query"], fetched["positives"], fetched["negatives"],
                                                 indices, strict=True):
            rng = random.Random(self.seed * 1_000_003 + index * 7_919 + int(self._visits[index]))
            self._visits[index] += 1
            items.append((query, rng.choice(positives), self._negatives(pool, index, rng)))
        return items

    def _negatives(self, pool: list[list[int]], index: int, rng: random.Random) -> list[list[int]]:
        if len(pool) >= self.num_negatives:
            return rng.sample(pool, self.num_negatives)
        negatives = list(pool)
        while len(negatives) < self.num_negatives:  # too few hard negatives: other rows' positives
            other = rng.randrange(len(self.rows))
            if other != index:
                negatives.append(rng.choice(self.rows[other]["positives"]))
        return negatives


class TokenCollator:
    """Pads cached token ids to each batch's longest text: the same tensors :class:`PairCollator` makes from texts."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        if tokenizer.pad_token_id is None:
            raise ValueError(f"tokenizer {tokenizer.name_or_path} has no pad token: set tokenizer.pad_token")
        self.pad_id = tokenizer.pad_token_id
        self.left = tokenizer.padding_side == "left"
        self.token_type_ids = "token_type_ids" in tokenizer.model_input_names

    def pad(self, rows: list[list[int]]) -> dict[str, torch.Tensor]:
        width = max(len(row) for row in rows)
        ids = np.full((len(rows), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            span = slice(width - len(row), width) if self.left else slice(0, len(row))
            ids[i, span] = row
            mask[i, span] = 1
        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}
        if self.token_type_ids:
            features["token_type_ids"] = torch.zeros_like(features["input_ids"])
        return features

    def __call__(self, rows: list[tuple[list[int], list[int], list[list[int]]]]) -> dict[str, Any]:
        query = self.pad([q for q, _, _ in rows])
        doc = self.pad([p for _, p, _ in rows] + [n for _, _, negatives in rows for n in negatives])
        real_tokens = int(query["attention_mask"].sum()) + int(doc["attention_mask"].sum())
        return {"query": query, "doc": doc, "num_negatives": len(rows[0][2]), "num_tokens": real_tokens}


class LengthGroupedSampler(Sampler[int]):
    """A shuffled order in which each run of ``batch_size`` indices holds texts of similar length.

    The epoch's permutation is cut into windows of ``window_batches`` batches; each window is sorted by length and
    cut into batches, and the batches of the whole epoch are shuffled, so that a step's padding shrinks while long
    and short batches still alternate. ``batch_size`` is the global batch (per-device batch x devices): under DDP
    Lightning deals out this order to the ranks in turn (DistributedSamplerWrapper), so one step's global batch is
    one group. Deterministic in (seed, epoch) on every rank; Lightning calls ``set_epoch``.
    """

    def __init__(self, lengths: np.ndarray, batch_size: int, window_batches: int = 50, seed: int = 0) -> None:
        self.lengths = np.asarray(lengths)
        self.batch_size = batch_size
        self.window_batches = max(1, window_batches)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        rng = np.random.default_rng([self.seed, self.epoch])
        order = rng.permutation(len(self.lengths))
        span = self.batch_size * self.window_batches
        batches = []
        for start in range(0, len(order), span):
            window = order[start : start + span]
            window = window[np.argsort(-self.lengths[window], kind="stable")]
            batches += [window[i : i + self.batch_size] for i in range(0, len(window), self.batch_size)]
        full = [b for b in batches if len(b) == self.batch_size]
        partial = [b for b in batches if len(b) < self.batch_size]  # at most one: last, dropped by drop_last
        for batch in [full[i] for i in rng.permutation(len(full))] + partial:
            yield from (int(i) for i in batch)


class _ExampleView(Sequence[Example]):
    """The cached training rows as Examples, read on access (for inspection; training reads the token ids)."""

    def __init__(self, cache: TokenizedCache) -> None:
        self.cache = cache

    def __len__(self) -> int:
        return len(self.cache)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self.cache.example(i) for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        return self.cache.example(index % len(self))

    def __iter__(self) -> Iterator[Example]:
        return (self.cache.example(i) for i in range(len(self)))


def token_lengths(tokenizer: PreTrainedTokenizerBase, texts: Sequence[str], max_length: int | None,
                  chunk: int = 8192) -> list[int]:
    """Tokens per text after truncation: the length a batch is padded to. Chunked: only the counts are kept."""
    lengths: list[int] = []
    for start in range(0, len(texts), chunk):
        ids = tokenizer(list(texts[start : start + chunk]), truncation=max_length is not None,
                        max_length=max_length)["input_ids"]
        lengths += [len(row) for row in ids]
    return lengths


class EvalTexts(Dataset):
    """Queries and corpus of a RetrievalSet as one list, longest first (less padding per batch).

    With the tokenizer, length is the token count after truncation (what a batch is padded to: on the demo corpus
    ~0.94 of the padded positions are real tokens, ~0.74 when sorting by characters); without, the characters.
    Each item carries a signed id: query i -> i, corpus entry j -> -(j + 1).
    """

    def __init__(self, retrieval: RetrievalSet, query_prefix: str = "", doc_prefix: str = "",
                 tokenizer: PreTrainedTokenizerBase | None = None, max_length: int | None = None) -> None:
        items = [(i, query_prefix + q) for i, q in enumerate(retrieval.queries)]
        items += [(-(j + 1), doc_prefix + d) for j, d in enumerate(retrieval.corpus)]
        texts = [text for _, text in items]
        lengths = token_lengths(tokenizer, texts, max_length) if tokenizer is not None else [0] * len(items)
        order = sorted(range(len(items)), key=lambda i: (lengths[i], len(texts[i])), reverse=True)
        self.items = [items[i] for i in order]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, index: int) -> tuple[int, str]:
        return self.items[index]


class EvalCollator(PairCollator):
    def __call__(self, items: list[tuple[int, str]]) -> dict[str, Any]:  # type: ignore[override]
        return {"ids": torch.tensor([i for i, _ in items], dtype=torch.long),
                "features": self._tokenize([text for _, text in items])}


class ContrastiveDataModule(LightningDataModule, abc.ABC):
    """Base: subclasses implement ``load_rows`` and ``source_signature``.

    ``prepare_data`` (local rank 0) streams the training rows once through cleaning, the validation split and the
    tokenizer into a memory-mapped token cache (``gte_pro.data.cache``); ``setup`` (every rank) opens it. A later
    run with the same source, tokenizer and settings starts from the cache without reading the source again.
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase | None = None,
        batch_size: int = 32,
        eval_batch_size: int = 64,
        num_negatives: int = 0,
        max_length: int = 256,
        num_workers: int = 0,
        pin_memory: bool = False,
        persistent_workers: bool = False,
        val_fraction: float = 0.05,
        max_val_queries: int | None = 1000,
        max_train_rows: int | None = None,
        min_query_chars: int = 3,
        min_doc_chars: int = 10,
        query_prefix: str = "",
        doc_prefix: str = "",
        seed: int = 42,
        cache_dir: str | None = None,
        group_by_length: bool = True,
        length_window: int = 50,
    ) -> None:
        super().__init__()
        if batch_size < 2:
            raise ValueError(f"data.batch_size={batch_size}: a contrastive batch needs at least 2 pairs")
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size
        self.num_negatives = num_negatives
        self.max_length = max_length
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.persistent_workers = persistent_workers and num_workers > 0
        self.val_fraction = val_fraction
        self.max_val_queries = max_val_queries
        self.max_train_rows = max_train_rows
        self.min_query_chars = min_query_chars
        self.min_doc_chars = min_doc_chars
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix
        self.seed = seed
        # where the token cache (and the demo corpus) live: conf/paths sets it; $GTE_PRO_CACHE for direct use
        self.cache_dir = cache_dir or os.environ.get("GTE_PRO_CACHE") or "~/.cache/gte_pro"
        self.group_by_length = group_by_length
        self.length_window = length_window
        self.token_cache: TokenizedCache | None = None
        self.retrieval: RetrievalSet | None = None
        self.reports: list[dict[str, Any]] = []
        self._live_reports: list[CleaningReport] = []
        self._private_cache: Path | None = None
        # named sets validated after the held-out split (add_eval_sets: eval.beir)
        self.extra_eval: list[tuple[str, RetrievalSet]] = []
        self.extra_eval_batch_size = eval_batch_size
        self.extra_eval_max_length = max_length

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
        return _ExampleView(self.token_cache) if self.token_cache is not None else []

    def _cache_folder(self) -> Path | None:
        signature = self.source_signature()
        if signature is None:
            return None
        tokenizer = self._require_tokenizer()
        key = cache_key({
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
        return folder

    def prepare_data(self) -> None:
        self._ensure_cache()  # Lightning calls this on local rank 0 only, before the other ranks' setup

    def _training_stream(self, rows: Iterable[Example], held_out: list[Example] | None) -> Iterator[Example]:
        """Training rows as they stream by; with ``held_out``, queries in the validation buckets go there instead
        (a stable hash of the query, so the split never drifts between runs or machines)."""
        cutoff = int(self.val_fraction * 1000)
        taken = 0
        for example in rows:
            if held_out is not None and split_bucket(example.query) < cutoff:
                held_out.append(example)
                continue
            if self.max_train_rows and taken >= self.max_train_rows:
                if held_out is None:
                    break
                continue  # keep reading: later rows may still be validation rows
            taken += 1
            yield example

    def _build_cache(self, folder: Path) -> None:
        tokenizer = self._require_tokenizer()
        self._live_reports = []
        tmp = temporary_folder(folder)
        try:
            train, val, distractors = self.load_rows()
            held_out: list[Example] = []
            rows = self._training_stream(train, held_out if val is None else None)
            log.info("data: tokenizing the training rows into %s", folder)
            count = write_tokenized(rows, tmp / "train.arrow", tokenizer, self.max_length, self.query_prefix,
                                    self.doc_prefix)
            val_rows = held_out if val is None else list(val)
            reports = [report.as_dict() for report in self._live_reports]
            self._check_rows(count, val_rows, reports)
            val_rows, distractors = self._cap_validation(val_rows, list(distractors))
            meta = {"rows": count, "reports": reports, "distractors": distractors,
                    "val": [[ex.query, ex.positives, ex.negatives] for ex in val_rows]}
            (tmp / "meta.json").write_text(json.dumps(meta))
            publish(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    def _check_rows(self, count: int, val: list[Example], reports: list[dict[str, Any]]) -> None:
        if not count:
            raise DataError(f"{type(self).__name__}: no training rows left after cleaning "
                            f"({'; '.join(r['source'] + ': ' + str(r['dropped']) for r in reports)})")
        if not val:
            raise DataError(f"{type(self).__name__}: no validation rows: provide a validation file or raise "
                            f"data.val_fraction (now {self.val_fraction})")

    def _cap_validation(self, val: list[Example], distractors: list[str]) -> tuple[list[Example], list[str]]:
        if self.max_val_queries and len(val) > self.max_val_queries:
            # the capped queries' positives stay in the corpus as distractors, so the task stays as hard
            distractors = [p for ex in val[self.max_val_queries :] for p in ex.positives] + distractors
            val = val[: self.max_val_queries]
        return val, distractors

    def setup(self, stage: str | None = None) -> None:
        if self.retrieval is not None:
            return
        cache = TokenizedCache(self._ensure_cache())
        self.reports = cache.meta["reports"]
        for report in self.reports:
            log.info("%s", CleaningReport.from_dict(report).summary())
        val, distractors = cache.validation()
        self.token_cache = cache
        self.retrieval = RetrievalSet.from_examples(val, distractors)
        log.info("data: %d training pairs (token cache %s); validation: %d queries over a corpus of %d documents",
                 len(cache), cache.folder, len(self.retrieval.queries), len(self.retrieval.corpus))

    def _loader(self, dataset: Dataset, batch_size: int, collate: Any, shuffle: bool, drop_last: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          collate_fn=collate, num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.persistent_workers)

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise RuntimeError("the data module needs the encoder's tokenizer (pass tokenizer=...)")
        return self.tokenizer

    def train_dataloader(self) -> DataLoader:
        if self.token_cache is None:
            raise RuntimeError("setup() first")
        if len(self.token_cache) < self.batch_size:
            raise DataError(f"only {len(self.token_cache)} training pairs, fewer than data.batch_size="
                            f"{self.batch_size}: lower the batch size or add data")
        pairs = TokenizedPairs(self.token_cache.token_rows(), self.num_negatives, self.seed)
        collate = TokenCollator(self._require_tokenizer())
        # drop_last: every step (and every rank) sees a full contrastive batch with the same number of negatives
        if not self.group_by_length:
            return self._loader(pairs, self.batch_size, collate, shuffle=True, drop_last=True)
        world_size = self.trainer.world_size if self.trainer is not None else 1
        sampler = LengthGroupedSampler(self.token_cache.lengths(), self.batch_size * world_size, self.length_window,
                                       self.seed)
        return DataLoader(pairs, batch_size=self.batch_size, sampler=sampler, drop_last=True, collate_fn=collate,
                          num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.persistent_workers)

    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        """Named retrieval sets (e.g. BEIR folders) validated after the held-out split, each logged on its own."""
        self.extra_eval = list(sets)
        self.extra_eval_batch_size = batch_size or self.eval_batch_size
        self.extra_eval_max_length = max_length or self.max_length

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        """(name, set) in val-dataloader order; the unnamed first one is the training data's held-out split."""
        assert self.retrieval is not None, "setup() first"
        return [("", self.retrieval), *self.extra_eval]

    def _eval_loader(self, retrieval: RetrievalSet, batch_size: int, max_length: int) -> DataLoader:
        collate = EvalCollator(self._require_tokenizer(), max_length)
        texts = EvalTexts(retrieval, self.query_prefix, self.doc_prefix, self.tokenizer, max_length)
        return self._loader(texts, batch_size, collate, shuffle=False, drop_last=False)

    def val_dataloader(self) -> DataLoader | list[DataLoader]:
        main, *extra = self.validation_sets()
        loaders = [self._eval_loader(main[1], self.eval_batch_size, self.max_length)]
        loaders += [self._eval_loader(rs, self.extra_eval_batch_size, self.extra_eval_max_length) for _, rs in extra]
        return loaders if extra else loaders[0]


class DemoDataModule(ContrastiveDataModule):
    """Summary line -> body pairs from the Python standard library's docstrings; works offline anywhere."""

    def __init__(self, max_distractors: int = 1000, **kwargs: Any) -> None:
        kwargs.setdefault("min_query_chars", 10)
        kwargs.setdefault("min_doc_chars", 40)
        kwargs.setdefault("val_fraction", 0.1)
        super().__init__(**kwargs)
        self.max_distractors = max_distractors

    def _options(self) -> dict[str, Any]:
        return {"val_fraction": self.val_fraction, "min_query_chars": self.min_query_chars,
                "min_doc_chars": self.min_doc_chars, "max_distractors": self.max_distractors}

    def source_signature(self) -> Any:
        # the corpus is a pure function of the Python version's standard library and these options
        return {"demo": sys.version, **self._options()}

    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        splits = load_demo_splits(self.cache_dir, **self._options())
        for report in splits.reports:
            self._record(report)
        return splits.train, splits.val, splits.distractors


class JsonlDataModule(ContrastiveDataModule):
    """JSON-lines files: {"query", "positive", "negatives"} or FlagEmbedding's {"query", "pos", "neg"}.

    The training file is streamed (parsed, cleaned and tokenized a chunk at a time): its size is not bounded by
    memory.
    """

    def __init__(self, train_file: str, val_file: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not train_file:
            raise DataError("data.train_file is required with data=jsonl")
        self.train_file = str(Path(train_file).expanduser())
        self.val_file = str(Path(val_file).expanduser()) if val_file else None

    def source_signature(self) -> Any:
        for path in filter(None, (self.train_file, self.val_file)):
            if not Path(path).is_file():
                raise DataError(f"{path}: file not found")
        return file_signature(*filter(None, (self.train_file, self.val_file)))

    def load_rows(self) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        train = self._clean(iter_pairs_jsonl(self.train_file), self.train_file)
        val = self._clean(iter_pairs_jsonl(self.val_file), self.val_file) if self.val_file else None
        return train, val, []


class HFDataModule(ContrastiveDataModule):
    """A ``datasets`` dataset (hub name, local data folder or ``save_to_disk`` folder) with a column mapping."""

    def __init__(self, path: str, name: str | None = None, train_split: str = "train",
                 val_split: str | None = None, columns: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.path = path
        self.name = name
        self.train_split = train_split
        self.val_split = val_split
        self.columns = {"query": "query", "positive": "positive", "negatives": "negatives", **(columns or {})}

    def source_signature(self) -> Any:
        local = Path(self.path).expanduser()
        # a hub dataset is identified by its name (datasets keeps its own cache of the download)
        source = file_signature(local) if local.exists() else {"hub": self.path, "name": self.name}
        return {"source": source, "splits": [self.train_split, self.val_split], "columns": self.columns}

    def _table(self, split: str) -> Any:
        import datasets

        local = Path(self.path).expanduser()
        if local.joinpath("dataset_dict.json").exists() or local.joinpath("dataset_info.json").exists():
            loaded = datasets.load_from_disk(str(local))
            return loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        return datasets.load_dataset(self.path, self.name, split=split)

    def _records(self, split: str) -> Iterator[Example]:
        where = f"{self.path}[{split}]"
        table = self._table(split)
        for role in ("query", "positive"):
            if self.columns[role] not in table.column_names:
                raise DataError(f"{where}: no column '{self.columns[role]}' for the {role} (data.columns.{role}); "
                                f"columns are: {', '.join(table.column_names)}")
        has_negatives = self.columns["negatives"] in table.column_names
        for index, row in enumerate(table):
            record = {"query": row[self.columns["query"]], "positive": row[self.columns["positive"]]}
            if has_negatives:
                record["negatives"] = row[self.columns["negatives"]] or []
            yield parse_record(record, f"{where}, row {index}")

    def _load_split(self, split: str) -> Iterator[Example]:
        return self._clean(self._records(split), f"{self.path}[{split}]")

    def load_rows(self) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        train = self._load_split(self.train_split)
        return train, (self._load_split(self.val_split) if self.val_split else None), []
