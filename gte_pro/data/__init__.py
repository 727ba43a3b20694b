"""Training data: record files, the offline demo corpus, and the Lightning data modules."""

from gte_pro.data.datamodule import ContrastiveDataModule, DemoDataModule, HFDataModule, JsonlDataModule
from gte_pro.data.records import DataError, Example

__all__ = ["ContrastiveDataModule", "DataError", "DemoDataModule", "Example", "HFDataModule", "JsonlDataModule"]
