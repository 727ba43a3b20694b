"""``data=jsonl``: your own JSON-lines files."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gte_pro.data.cache import file_signature
from gte_pro.data.records import Example, iter_jsonl, iter_pairs_jsonl
from gte_pro.data.scores import SCORE_FIELDS
from gte_pro.data.sources import RowSource
from gte_pro.errors import CHECK_PATH, DataError

if TYPE_CHECKING:
    from gte_pro.data.token_cache import TokenCache


class JsonlRows(RowSource):
    """JSON-lines files: {"query", "positive", "negatives"} or FlagEmbedding's {"query", "pos", "neg"}.

    The training file is streamed (parsed, cleaned and tokenized a chunk at a time): its size is not bounded by
    memory.
    """

    module_name = "JsonlDataModule"

    def __init__(self, *, train_file: str, val_file: str | None) -> None:
        if not train_file:
            raise DataError("data.train_file is required with data=jsonl")
        self.train_file = str(Path(train_file).expanduser())
        self._val_file = str(Path(val_file).expanduser()) if val_file else None

    @property
    def val_file(self) -> str | None:
        return self._val_file

    def where(self) -> str:
        return self.train_file

    def signature(self, tokens: TokenCache) -> Any:
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

    def load_rows(self, tokens: TokenCache) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        train = tokens.clean(iter_pairs_jsonl(self.train_file), self.train_file)
        val = None
        if self.val_file:
            val = tokens.clean_validation(iter_pairs_jsonl(self.val_file), self.val_file, "data.val_file")
        return train, val, []
