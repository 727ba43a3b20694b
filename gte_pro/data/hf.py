"""``data=hf``: a Hugging Face ``datasets`` dataset with a column mapping."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gte_pro.data.cache import file_signature
from gte_pro.data.records import Example, parse_record
from gte_pro.data.scores import SCORE_FIELDS, ScoredFile
from gte_pro.data.sources import RowSource
from gte_pro.errors import DataError

if TYPE_CHECKING:
    from gte_pro.data.token_cache import TokenCache

ROLES = ("query", "positive", "negatives")


def _root_cause(error: BaseException, limit: int = 300) -> str:
    """``Type: first line`` of the innermost cause: datasets wraps a JSON parse error (which names the row) in a
    DatasetGenerationError that only says "An error occurred while generating the dataset"."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {(lines[0] if lines else '')[:limit]}"


class HfRows(RowSource):
    """A ``datasets`` dataset (hub name, local data folder or ``save_to_disk`` folder) with a column mapping."""

    module_name = "HFDataModule"

    def __init__(self, *, path: str, name: str | None, train_split: str, val_split: str | None,
                 columns: dict[str, str] | None) -> None:
        if not path or not isinstance(path, str):
            raise DataError(f"data.path={path!r}: a hub name, a local data folder or a save_to_disk folder is "
                            "required with data=hf")
        unknown = sorted(set(columns or {}) - set(ROLES))
        if unknown:
            raise DataError(f"data.columns: unknown role(s) {', '.join(unknown)}; valid choices: {', '.join(ROLES)}")
        self.path = path
        self.name = name
        self.train_split = train_split
        self.val_split = val_split
        self.columns = {role: role for role in ROLES} | dict(columns or {})

    def where(self) -> str:
        return self.path

    def signature(self, tokens: TokenCache) -> Any:
        local = Path(self.path).expanduser()
        # a hub dataset is identified by its name (datasets keeps its own cache of the download)
        source = file_signature(local) if local.exists() else {"hub": self.path, "name": self.name}
        return {"source": source, "splits": [self.train_split, self.val_split], "columns": self.columns}

    def has_teacher_scores(self) -> bool:
        """Whether the training split has FlagEmbedding's pos_scores column (loads it: datasets keeps it cached)."""
        return "pos_scores" in self._table(self.train_split).column_names

    def _load(self, split: str) -> Any:
        import datasets

        local = Path(self.path).expanduser()
        if local.joinpath("dataset_dict.json").exists() or local.joinpath("dataset_info.json").exists():
            return datasets.load_from_disk(str(local))
        return datasets.load_dataset(self.path, self.name, split=split)

    def _table(self, split: str) -> Any:
        import datasets

        try:
            loaded = self._load(split)
        except Exception as err:  # datasets raises many types (JSON, Arrow, file, split, hub errors): name the path
            raise DataError(f"{self.path}: could not load split '{split}' ({_root_cause(err)})") from err
        if isinstance(loaded, datasets.DatasetDict):
            if split not in loaded:
                raise DataError(f"{self.path}: no split '{split}' (data.train_split / data.val_split); valid "
                                f"choices: {', '.join(loaded) or 'none'}")
            return loaded[split]
        return loaded

    def _records(self, split: str) -> Iterator[Example]:
        where = f"{self.path}[{split}]"
        table = self._table(split)
        for role in ("query", "positive"):
            if self.columns[role] not in table.column_names:
                raise DataError(f"{where}: no column '{self.columns[role]}' for the {role} (data.columns.{role}); "
                                f"columns are: {', '.join(table.column_names)}")
        has_negatives = self.columns["negatives"] in table.column_names
        score_columns = [name for name in SCORE_FIELDS if name in table.column_names]
        scored = ScoredFile()
        for index, row in enumerate(table):
            record = {"query": row[self.columns["query"]], "positive": row[self.columns["positive"]]}
            if has_negatives:
                # Arrow stores a missing list as null: no hard negatives for this row
                record["negatives"] = row[self.columns["negatives"]] or []
            record |= {name: row[name] for name in score_columns}  # teacher scores: FlagEmbedding's column names
            # errors name the dataset's own columns (data.columns), not our role names
            example = parse_record(record, f"{where}, row {index}", self.columns)
            scored.check(example.pos_scores is not None, f"{where}, row {index}")
            yield example

    def load_rows(self, tokens: TokenCache) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        train = tokens.clean(self._records(self.train_split), f"{self.path}[{self.train_split}]")
        val = None
        if self.val_split:
            val = tokens.clean_validation(self._records(self.val_split), f"{self.path}[{self.val_split}]",
                                          "data.val_split")
        return train, val, []
