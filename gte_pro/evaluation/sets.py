"""The retrieval sets named in ``eval.beir``: which folders, under which names, and the data module that serves
them (to ``mode=eval``, or next to the held-out split during training)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule
from omegaconf import DictConfig, ListConfig, OmegaConf
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from gte_pro.data.beir import BeirSet, qrels_path, relevant_texts
from gte_pro.data.cache import file_signature
from gte_pro.data.collaborators import CandidateSource
from gte_pro.data.corpus_store import load_beir_stored
from gte_pro.data.token_cache import Tokenization
from gte_pro.data.validation import Validation
from gte_pro.errors import ConfigError
from gte_pro.retrieval import RetrievalSet
from gte_pro.utils.cache import cache_root

SET_FILES = ("queries.jsonl", "corpus.jsonl")


def _entry_spec(entry: Any, where: str) -> tuple[str, Any, Any]:
    """(path, split or None, name or None) of one ``eval.beir`` entry; anything but a folder name or a
    {path, split, name} mapping of strings is a ValueError naming the entry."""
    if isinstance(entry, DictConfig):
        entry = OmegaConf.to_container(entry, resolve=True)
    if isinstance(entry, Mapping):
        unknown = set(entry) - {"path", "split", "name"}
        if "path" not in entry or unknown:
            raise ConfigError(f"{where}={entry}: expected a folder or {{path, split, name}}"
                             + (f" (unknown keys: {', '.join(sorted(map(str, unknown)))})" if unknown else ""))
        path, split, name = entry["path"], entry.get("split"), entry.get("name")
    else:
        path, split, name = entry, None, None
    path = os.fspath(path) if isinstance(path, os.PathLike) else path
    for key, value in (("path", path), ("split", split), ("name", name)):
        # a split or name may be written as a number (split: 2020); a list, a mapping or an empty string may not
        text_like = isinstance(value, str | int) and not isinstance(value, bool) and str(value).strip()
        if not (value is None and key != "path") and not text_like:
            raise ConfigError(f"{where}: {key}={value!r} is not valid; expected a folder name or "
                             "{path: folder, split: name, name: name} with non-empty strings")
    return str(path), split, name


def eval_set_specs(entries: Sequence[Any] | str, default_split: str) -> list[tuple[str, str, str]]:
    """(path, split, name) per ``eval.beir`` entry: a folder, or a {path, split, name} mapping."""
    if isinstance(entries, str):  # eval.beir=data/scifact: one folder, not one folder per character
        entries = [entries]
    if not isinstance(entries, Sequence | ListConfig):
        raise ConfigError(f"eval.beir={entries!r}: expected a list of BEIR folders, e.g. eval.beir=[data/scifact]")
    specs = []
    for index, entry in enumerate(entries):
        path, split, name = _entry_spec(entry, f"eval.beir[{index}]")
        specs.append((path, str(split or default_split), str(name or Path(path).expanduser().name)))
    names = [name for _, _, name in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(f"eval.beir: two sets are named {', '.join(duplicates)}; give each a name "
                         f"({{path: ..., name: ...}})")
    return specs


def load_eval_sets(cfg: Any, tokenizer: PreTrainedTokenizerBase, doc_prefix: str = "",
                   max_length: int | None = None) -> list[tuple[str, BeirSet]]:
    """The BEIR sets that ``cfg.eval.beir`` names. Each corpus is tokenized once (``eval.max_length``, else
    ``max_length``) into a store under ``paths.cache_dir`` that later runs reuse; a rank reads the documents it
    embeds from there, so no process holds a corpus in memory."""
    eval_cfg = cfg.get("eval")
    if not eval_cfg or not eval_cfg.get("beir"):
        return []
    length = int(eval_cfg.get("max_length") or max_length or tokenizer.model_max_length)
    cache_dir = cache_root(OmegaConf.select(cfg, "paths.cache_dir", default=None))
    return [(name, load_beir_stored(path, split, name, tokenizer, length, doc_prefix, cache_dir))
            for path, split, name in eval_set_specs(eval_cfg.beir, eval_cfg.split)]


class BeirEvalSets:
    """``cfg.eval.beir`` as a data module's ``eval_sets`` (``gte_pro.data.collaborators.EvalSetSource``): validated,
    and logged as ``val/<name>/<metric>``, after the training data's held-out split."""

    def __init__(self, cfg: Any) -> None:
        self.cfg = cfg
        self.batch_size = cfg.eval.get("batch_size")
        self.max_length = cfg.eval.get("max_length")
        self.specs = eval_set_specs(cfg.eval.beir, cfg.eval.split)

    def load(self, tokenizer: PreTrainedTokenizerBase, doc_prefix: str, max_length: int) -> list[tuple[str, BeirSet]]:
        return load_eval_sets(self.cfg, tokenizer, doc_prefix, max_length)

    def texts(self) -> list[tuple[str, list[str], list[str]]]:
        return [(name, *relevant_texts(path, split)) for path, split, name in self.specs]

    def signature(self) -> list[Any]:
        return [[name, split, file_signature(*(Path(path).expanduser() / file for file in SET_FILES),
                                             qrels_path(path, split))] for path, split, name in self.specs]


def eval_set_source(cfg: Any) -> BeirEvalSets | None:
    """The training data module's ``eval_sets``: those of ``cfg.eval.beir``, None when it names none."""
    eval_cfg = cfg.get("eval")
    return BeirEvalSets(cfg) if eval_cfg and eval_cfg.get("beir") else None


class EvalDataModule(LightningDataModule):
    """Named retrieval sets only (``mode=eval``): one validation dataloader each, texts sorted by length (or, for a
    reranker, each query's candidate pairs)."""

    def __init__(self, sets: Sequence[tuple[str, RetrievalSet]], form: Tokenization, validation: Validation) -> None:
        super().__init__()
        if not sets:
            raise ValueError("EvalDataModule: no evaluation sets")
        self.sets = list(sets)
        self.form = form
        self.validation = validation

    @property
    def tokenizer(self) -> PreTrainedTokenizerBase | None:
        return self.form.tokenizer

    @property
    def candidate_source(self) -> CandidateSource | None:
        return self.validation.candidate_source

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        return list(self.sets)

    def val_dataloader(self) -> list[DataLoader]:
        batch_size = self.validation.eval_batch_size
        return [self.validation.loader(index, retrieval, batch_size, self.form.max_length, self.form)
                for index, (_, retrieval) in enumerate(self.sets)]
