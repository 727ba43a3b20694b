"""Lightning data modules: where the (query, positive[, negatives]) rows come from, and how they are batched.

One base class does batching (dynamic padding: each batch is padded to its own longest text, never to
``max_length``), cleaning, splitting and the retrieval validation set; subclasses only say where rows come from.
"""

from __future__ import annotations

import abc
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import DataLoader, Dataset
from transformers import PreTrainedTokenizerBase

from gte_pro.data.demo import load_demo_splits, split_bucket
from gte_pro.data.records import CleaningReport, DataError, Example, clean_examples, parse_record, read_pairs_jsonl
from gte_pro.evaluation import RetrievalSet

log = logging.getLogger(__name__)


class TrainPairs(Dataset):
    """Rows -> (query, positive, k negatives). Missing hard negatives are filled with other rows' positives."""

    def __init__(self, examples: Sequence[Example], num_negatives: int, seed: int) -> None:
        self.examples = list(examples)
        self.num_negatives = num_negatives
        self.seed = seed
        self._visits = [0] * len(self.examples)  # makes each epoch draw other positives/negatives

    def __len__(self) -> int:
        return len(self.examples)

    def __getitem__(self, index: int) -> tuple[str, str, list[str]]:
        example = self.examples[index]
        rng = random.Random(self.seed * 1_000_003 + index * 7_919 + self._visits[index])
        self._visits[index] += 1
        positive = rng.choice(example.positives)
        pool = example.negatives
        if len(pool) >= self.num_negatives:
            negatives = rng.sample(pool, self.num_negatives)
        else:
            negatives = list(pool)
            while len(negatives) < self.num_negatives:
                other = self.examples[rng.randrange(len(self.examples))]
                if other is not example:
                    negatives.append(rng.choice(other.positives))
        return example.query, positive, negatives


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
    """Base: subclasses implement ``load_rows`` (and may override ``prepare_data`` to build caches)."""

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
        self.train_rows: list[Example] = []
        self.retrieval: RetrievalSet | None = None
        self.reports: list[dict[str, Any]] = []
        # named sets validated after the held-out split (add_eval_sets: eval.beir)
        self.extra_eval: list[tuple[str, RetrievalSet]] = []
        self.extra_eval_batch_size = eval_batch_size
        self.extra_eval_max_length = max_length

    # --- what subclasses provide -------------------------------------------------------------------------
    @abc.abstractmethod
    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        """(train rows, validation rows or None to split them off the training rows, distractor documents)."""

    # --- shared logic ---------------------------------------------------------------------------------------
    def _clean(self, rows: list[Example], source: str) -> list[Example]:
        kept, report = clean_examples(rows, source, self.min_query_chars, self.min_doc_chars)
        self._record(report)
        return kept

    def _record(self, report: CleaningReport | dict[str, Any]) -> None:
        report = CleaningReport.from_dict(report) if isinstance(report, dict) else report
        self.reports.append(report.as_dict())
        log.info("%s", report.summary())

    def _split(self, rows: list[Example]) -> tuple[list[Example], list[Example]]:
        cutoff = int(self.val_fraction * 1000)
        train = [ex for ex in rows if split_bucket(ex.query) >= cutoff]
        val = [ex for ex in rows if split_bucket(ex.query) < cutoff]
        return train, val

    def setup(self, stage: str | None = None) -> None:
        if self.retrieval is not None:
            return
        self.reports = []
        train, val, distractors = self.load_rows()
        if val is None:
            train, val = self._split(train)
        if not train:
            raise DataError(f"{type(self).__name__}: no training rows left after cleaning "
                            f"({'; '.join(r['source'] + ': ' + str(r['dropped']) for r in self.reports)})")
        if not val:
            raise DataError(f"{type(self).__name__}: no validation rows: provide a validation file or raise "
                            f"data.val_fraction (now {self.val_fraction})")
        if self.max_train_rows:
            train = train[: self.max_train_rows]
        if self.max_val_queries and len(val) > self.max_val_queries:
            # the capped queries' positives stay in the corpus as distractors, so the task stays as hard
            distractors = [p for ex in val[self.max_val_queries :] for p in ex.positives] + list(distractors)
            val = val[: self.max_val_queries]
        self.train_rows = train
        self.retrieval = RetrievalSet.from_examples(val, distractors)
        log.info("data: %d training pairs; validation: %d queries over a corpus of %d documents",
                 len(train), len(self.retrieval.queries), len(self.retrieval.corpus))

    def _loader(self, dataset: Dataset, batch_size: int, collate: Any, shuffle: bool, drop_last: bool) -> DataLoader:
        return DataLoader(dataset, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
                          collate_fn=collate, num_workers=self.num_workers, pin_memory=self.pin_memory,
                          persistent_workers=self.persistent_workers)

    def _require_tokenizer(self) -> PreTrainedTokenizerBase:
        if self.tokenizer is None:
            raise RuntimeError("the data module needs the encoder's tokenizer (pass tokenizer=...)")
        return self.tokenizer

    def train_dataloader(self) -> DataLoader:
        if len(self.train_rows) < self.batch_size:
            raise DataError(f"only {len(self.train_rows)} training pairs, fewer than data.batch_size="
                            f"{self.batch_size}: lower the batch size or add data")
        collate = PairCollator(self._require_tokenizer(), self.max_length, self.query_prefix, self.doc_prefix)
        # drop_last: every step (and every rank) sees a full contrastive batch with the same number of negatives
        return self._loader(TrainPairs(self.train_rows, self.num_negatives, self.seed), self.batch_size, collate,
                            shuffle=True, drop_last=True)

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

    def __init__(self, cache_dir: str = "~/.cache/gte_pro", max_distractors: int = 1000, **kwargs: Any) -> None:
        kwargs.setdefault("min_query_chars", 10)
        kwargs.setdefault("min_doc_chars", 40)
        kwargs.setdefault("val_fraction", 0.1)
        super().__init__(**kwargs)
        self.cache_dir = cache_dir
        self.max_distractors = max_distractors

    def _splits(self):
        return load_demo_splits(self.cache_dir, val_fraction=self.val_fraction, min_query_chars=self.min_query_chars,
                                min_doc_chars=self.min_doc_chars, max_distractors=self.max_distractors)

    def prepare_data(self) -> None:
        self._splits()  # builds the cache once, on local rank 0, before the other ranks read it

    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        splits = self._splits()
        for report in splits.reports:
            self._record(report)
        return splits.train, splits.val, splits.distractors


class JsonlDataModule(ContrastiveDataModule):
    """JSON-lines files: {"query", "positive", "negatives"} or FlagEmbedding's {"query", "pos", "neg"}."""

    def __init__(self, train_file: str, val_file: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not train_file:
            raise DataError("data.train_file is required with data=jsonl")
        self.train_file = str(Path(train_file).expanduser())
        self.val_file = str(Path(val_file).expanduser()) if val_file else None

    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        train = self._clean(read_pairs_jsonl(self.train_file), self.train_file)
        val = self._clean(read_pairs_jsonl(self.val_file), self.val_file) if self.val_file else None
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

    def _load_split(self, split: str) -> list[Example]:
        import datasets

        where = f"{self.path}[{split}]"
        if Path(self.path).expanduser().joinpath("dataset_dict.json").exists() or \
                Path(self.path).expanduser().joinpath("dataset_info.json").exists():
            loaded = datasets.load_from_disk(str(Path(self.path).expanduser()))
            table = loaded[split] if isinstance(loaded, datasets.DatasetDict) else loaded
        else:
            table = datasets.load_dataset(self.path, self.name, split=split)
        for role in ("query", "positive"):
            if self.columns[role] not in table.column_names:
                raise DataError(f"{where}: no column '{self.columns[role]}' for the {role} (data.columns.{role}); "
                                f"columns are: {', '.join(table.column_names)}")
        has_negatives = self.columns["negatives"] in table.column_names
        rows = []
        for index, row in enumerate(table):
            record = {"query": row[self.columns["query"]], "positive": row[self.columns["positive"]]}
            if has_negatives:
                record["negatives"] = row[self.columns["negatives"]] or []
            rows.append(parse_record(record, f"{where}, row {index}"))
        return self._clean(rows, where)

    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        train = self._load_split(self.train_split)
        return train, (self._load_split(self.val_split) if self.val_split else None), []
