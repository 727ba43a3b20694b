"""``data=hf``: a Hugging Face ``datasets`` dataset with a column mapping."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.cache import file_signature
from gte_pro.data.records import DataError, Example, parse_record


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
