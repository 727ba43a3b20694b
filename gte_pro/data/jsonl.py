"""``data=jsonl``: your own JSON-lines files."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.cache import file_signature
from gte_pro.data.records import CleaningReport, Example, clean_required, iter_jsonl, iter_pairs_jsonl
from gte_pro.data.scores import SCORE_FIELDS
from gte_pro.errors import CHECK_PATH, DataError


class JsonlDataModule(ContrastiveDataModule):
    """JSON-lines files: {"query", "positive", "negatives"} or FlagEmbedding's {"query", "pos", "neg"}.

    The training file is streamed (parsed, cleaned and tokenized a chunk at a time): its size is not bounded by
    memory.
    """

    def __init__(self, *, train_file: str, val_file: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not train_file:
            raise DataError("data.train_file is required with data=jsonl")
        self.train_file = str(Path(train_file).expanduser())
        self.val_file = str(Path(val_file).expanduser()) if val_file else None

    def source_signature(self) -> Any:
        for path in filter(None, (self.train_file, self.val_file)):
            if Path(path).is_dir():
                raise DataError(f"{path}: is a folder, expected a JSON-lines file", hint=CHECK_PATH)
            if not Path(path).is_file():
                raise DataError(f"{path}: file not found", hint=CHECK_PATH)
        return file_signature(*filter(None, (self.train_file, self.val_file)))

    def has_teacher_scores(self) -> bool:
        """Whether the training file carries teacher scores: its first row decides (every row must agree)."""
        first = next(iter_jsonl(self.train_file), (0, None))[1]
        return isinstance(first, dict) and any(name in first for name in SCORE_FIELDS)

    def load_rows(self) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        train = self._clean(iter_pairs_jsonl(self.train_file), self.train_file)
        val = None
        if self.val_file:
            report = CleaningReport(self.val_file)
            self._record(report)
            val = clean_required(iter_pairs_jsonl(self.val_file), report, "data.val_file", self.min_query_chars,
                                 self.min_doc_chars)
        return train, val, []
