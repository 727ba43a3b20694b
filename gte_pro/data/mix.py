"""``data=mix``: several sources in one run, each batch drawn from one source with p_i proportional to n_i ** alpha
(the GTE paper's multi-source sampling) or to explicit weights.

Each source is a data module of its own (``jsonl``, ``hf``, ``beir``, ``demo``: its own token cache, cleaning and
validation split), built with the mix's shared ``data.*`` keys unless its spec sets them. Training draws from all of
them through one ``MixSampler`` (``gte_pro.data.mix_sampling``); validation scores each source's held-out split as
the named set ``<source>`` and logs their mean as ``val/<metric>`` (the monitored ``val/ndcg@10``).
"""

from __future__ import annotations

import bisect
import contextlib
import inspect
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.beir import BeirDataModule
from gte_pro.data.collaborators import COLLABORATORS
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.demo import DemoDataModule
from gte_pro.data.hf import HFDataModule
from gte_pro.data.jsonl import JsonlDataModule
from gte_pro.data.mix_sampling import MixedPairs, MixSampler, offsets_of, source_probabilities
from gte_pro.data.records import Example
from gte_pro.data.sampling import ResumableLoader
from gte_pro.errors import DataError
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)

SOURCE_TYPES: dict[str, type[ContrastiveDataModule]] = {
    "jsonl": JsonlDataModule, "hf": HFDataModule, "beir": BeirDataModule, "demo": DemoDataModule}
# one batch layout, tokenizer and loader for the whole mix: a source cannot set these (a source may set its
# cleaning, split, max_length, eval_batch_size, cache_dir, its own query instruction (query_prefix, in place of the
# model's: a decoder embedder's "Instruct: <task>\nQuery: " per task) and, with same_source_batches, num_negatives)
MIX_ONLY = frozenset({"tokenizer", "batch_size", "seed", "doc_prefix", "num_workers", "pin_memory",
                      "persistent_workers", "group_by_length", "length_window"})
_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a source's name is part of its metric keys: val/<name>/ndcg@10


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def _arguments(cls: type) -> tuple[set[str], set[str]]:
    """(accepted keyword arguments, required ones) of a source class, with the base data module's."""
    accepted, required = set(), set()
    for klass in (cls, ContrastiveDataModule):
        for param in list(inspect.signature(klass.__init__).parameters.values())[1:]:
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                accepted.add(param.name)
                if param.default is param.empty:
                    required.add(param.name)
    return accepted, required


def _source_options(name: str, spec: Any) -> tuple[type[ContrastiveDataModule], dict[str, Any]]:
    """(class, its own options) of ``data.sources.<name>``; every bad key is a DataError naming it."""
    where = f"data.sources.{name}"
    if not _NAME.fullmatch(name):
        raise DataError(f"{where}: a source name may only hold letters, digits, '_' and '-' (it names the metrics "
                        f"val/<name>/...)")
    if not isinstance(spec, Mapping):
        raise DataError(f"{where}={spec!r}: expected a mapping {{type: {'|'.join(SOURCE_TYPES)}, <its keys>}}")
    options = {str(key): value for key, value in spec.items()}
    kind = options.pop("type", None)
    if kind not in SOURCE_TYPES:
        got = " is required" if kind is None else f"={kind!r} is not a source type"
        raise DataError(f"{where}.type{got}; valid choices: {', '.join(SOURCE_TYPES)}")
    cls = SOURCE_TYPES[kind]
    accepted, required = _arguments(cls)
    for key in options:
        if key in MIX_ONLY:
            raise DataError(f"{where}.{key}: shared by all sources of a mix; set data.{key} instead")
        if key not in accepted:
            raise DataError(f"{where}.{key}: not a setting of a {kind} source; valid keys: type, "
                            f"{', '.join(sorted(accepted - MIX_ONLY))}")
    missing = sorted(required - set(options))
    if missing:
        raise DataError(f"{where}.{missing[0]} is required for a {kind} source (see conf/data/{kind}.yaml)")
    return cls, options


def build_sources(sources: Any, shared: dict[str, Any], same_source_batches: bool) -> dict[str, ContrastiveDataModule]:
    """name -> data module of each ``data.sources`` entry: the shared keys, then the source's own."""
    sources = _plain(sources)
    if not isinstance(sources, Mapping) or not sources:
        raise DataError(f"data.sources={sources!r}: expected at least one source, as name -> {{type: "
                        f"{'|'.join(SOURCE_TYPES)}, <its keys>}}, e.g. "
                        "data.sources='{qa: {type: jsonl, train_file: qa.jsonl}}'")
    modules = {}
    for name, spec in sources.items():
        cls, options = _source_options(str(name), spec)
        with _named(str(name)):
            modules[str(name)] = cls(**{**shared, **options})
    check_same_negatives(modules, same_source_batches)
    return modules


def check_same_negatives(modules: Mapping[str, ContrastiveDataModule], same_source_batches: bool) -> None:
    """With same_source_batches=false a batch mixes sources: they need one number of negatives. Checked on the
    settings when built, and again after setup, when num_negatives=null has become each file's own count."""
    negatives = {name: module.num_negatives for name, module in modules.items()}
    if same_source_batches or len({k for k in negatives.values() if k is not None}) < 2:
        return
    raise DataError(f"data.sources: num_negatives differ ({', '.join(f'{n}: {k}' for n, k in negatives.items())})"
                    " but with data.same_source_batches=false every batch mixes sources: give them one "
                    "data.num_negatives, or set data.same_source_batches=true")


def check_weights(weights: Any, names: Sequence[str]) -> list[float] | None:
    """``data.weights`` as one number >= 0 per source (a mapping name -> weight, or a list in source order)."""
    weights = _plain(weights)
    if weights is None:
        return None
    if isinstance(weights, Mapping):
        unknown, missing = sorted(set(map(str, weights)) - set(names)), [n for n in names if n not in weights]
        wrong = [f"{what} {', '.join(keys)}" for what, keys in (("unknown", unknown), ("missing", missing)) if keys]
        if wrong:
            raise DataError(f"data.weights: {'; '.join(wrong)}; give one weight per source: {', '.join(names)}")
        values, keys = [weights[n] for n in names], [f"data.weights.{n}" for n in names]
    elif isinstance(weights, list | tuple):
        if len(weights) != len(names):
            raise DataError(f"data.weights={weights}: {len(weights)} weights for {len(names)} sources "
                            f"({', '.join(names)})")
        values, keys = list(weights), [f"data.weights[{i}]" for i in range(len(names))]
    else:
        raise DataError(f"data.weights={weights!r}: expected name -> weight for the sources {', '.join(names)}")
    for key, value in zip(keys, values, strict=True):
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise DataError(f"{key}={value!r}: expected a number >= 0")
    if not sum(values):
        raise DataError("data.weights: all zero; at least one source needs a positive weight")
    return [float(v) for v in values]


@contextlib.contextmanager
def _named(name: str) -> Iterator[None]:
    """A source's data errors name the source they come from."""
    try:
        yield
    except DataError as err:
        raise DataError(f"data.sources.{name}: {err}") from err


class MixedRows(Sequence[Example]):
    """The sources' cleaned training rows as one sequence in global row order (``batch["rows"]`` indexes it)."""

    def __init__(self, parts: Sequence[Sequence[Example]]) -> None:
        self.parts = list(parts)
        self.offsets = offsets_of([len(part) for part in self.parts]).tolist()

    def __len__(self) -> int:
        return self.offsets[-1]

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(len(self))[index]]
        if not -len(self) <= index < len(self):
            raise IndexError(index)
        index %= len(self)
        source = bisect.bisect_right(self.offsets, index) - 1
        return self.parts[source][index - self.offsets[source]]

    def __iter__(self) -> Iterator[Example]:
        return (row for part in self.parts for row in part)


class MixDataModule(ContrastiveDataModule):
    """Several sources, each batch from one of them (``same_source_batches``) or mixed row by row.

    ``sources``: name -> {type: jsonl|hf|beir|demo, <that source's keys>}; ``weights``: name -> weight (none:
    p_i proportional to n_i ** ``alpha``, n_i the source's training rows after cleaning). An epoch is
    ``sum(n_i) // (batch_size x devices)`` steps. ``batch["rows"]`` are global rows: source i's rows follow
    those of the sources before it (``train_rows`` reads them back).
    """

    batches_from_train_sampler = False  # its own sampler over the sources' caches (train_dataloader)

    def __init__(self, *, sources: Any, weights: Any = None, alpha: float = 0.5, same_source_batches: bool = True,
                 **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.alpha = float(alpha)
        self.same_source_batches = same_source_batches
        # the collaborators (eval sets, a reranker's pair joining, ...) are the mix's, not its sources'
        shared = {key: value for key, value in kwargs.items() if key not in COLLABORATORS}
        self.sources = build_sources(sources, shared, same_source_batches)
        for source in self.sources.values():  # data.decontaminate: each source against its split and eval.beir
            source.decontaminate_sets = self.decontaminate_sets
        self.weights = check_weights(weights, list(self.sources))
        # the module logs the mean of these sets' metrics as val/<metric> (the first set is not the held-out one)
        self.averaged_sets = list(self.sources)
        self.source_rows: dict[str, int] = {}
        self.probabilities: dict[str, float] = {}

    def load_rows(self) -> tuple[list[Example], list[Example] | None, list[str]]:
        # the base class's single-cache path: a mix overrides prepare_data/setup and never takes it (each source
        # builds its own token cache), so reaching here is a programming error, not a missing feature
        raise RuntimeError("MixDataModule has no rows of its own: read them through MixDataModule.sources")

    def prepare_data(self) -> None:
        for name, source in self.sources.items():
            with _named(name):
                source.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.source_rows:
            return
        for name, source in self.sources.items():
            with _named(name):
                source.setup(stage)
        self.reports = [{**report, "mix_source": name} for name, source in self.sources.items()
                        for report in source.reports]
        check_same_negatives(self.sources, self.same_source_batches)
        reports = {name: source.decontamination for name, source in self.sources.items() if source.decontamination}
        self.decontamination = {"sources": reports} if reports else None
        self.source_rows = {name: len(source.train_rows) for name, source in self.sources.items()}
        probabilities = source_probabilities(list(self.source_rows.values()), self.weights, self.alpha)
        self.probabilities = dict(zip(self.sources, map(float, probabilities), strict=True))
        rule = "explicit weights" if self.weights else f"n ** {self.alpha:g}"
        for name, source in self.sources.items():
            log.info("data: source %s: %d training pairs, drawn with p=%.4f (%s); validation: %d queries", name,
                     self.source_rows[name], self.probabilities[name], rule, len(source.retrieval.queries))

    @property
    def train_rows(self) -> Sequence[Example]:
        """All sources' training rows in global row order (empty before ``setup``)."""
        return MixedRows([source.train_rows for source in self.sources.values()]) if self.source_rows else []

    def train_dataloader(self) -> DataLoader:
        if not self.source_rows:
            raise RuntimeError("setup() first")
        trainer = self.trainer
        world_size, rank = (trainer.world_size, trainer.global_rank) if trainer is not None else (1, 0)
        for name, rows in self.source_rows.items():
            if self.probabilities[name] > 0 and rows < self.batch_size * world_size:
                raise DataError(f"data.sources.{name}: only {rows} training pairs, fewer than one global batch "
                                f"(data.batch_size={self.batch_size} x {world_size} devices): lower the batch size, "
                                f"add data or give it data.weights.{name}=0")
        sources = list(self.sources.values())
        pairs = MixedPairs([TokenizedPairs(s.token_cache.token_rows(), s.num_negatives, self.seed) for s in sources])
        lengths = [s.token_cache.lengths() for s in sources] if self.group_by_length else None
        sampler = MixSampler(list(self.source_rows.values()), list(self.probabilities.values()), self.batch_size,
                             world_size, rank, self.seed, self.same_source_batches, lengths, self.length_window)
        loader = ResumableLoader(pairs, sampler, batch_size=self.batch_size, drop_last=True,
                                 collate_fn=self.train_collate(self._require_tokenizer(),
                                                               any(s.token_cache.scored for s in sources)),
                                 num_workers=self.num_workers,
                                 pin_memory=self.pin_memory, persistent_workers=self.persistent_workers)
        if self._resume_position is not None:
            loader.load_state_dict(self._resume_position)
            self._resume_position = None
        self._train_loader = loader
        return loader

    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        clash = sorted({name for name, _ in sets} & set(self.sources))
        if clash:
            raise DataError(f"eval.beir: the set name(s) {', '.join(clash)} are also data.sources names: both would "
                            "log val/<name>/...; name the BEIR set otherwise ({path: ..., name: ...})")
        super().add_eval_sets(sets, batch_size, max_length)

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        """Each source's held-out split under its name, then the eval.beir sets."""
        assert self.source_rows, "setup() first"
        return [(name, source.retrieval) for name, source in self.sources.items()] + list(self.extra_eval)

    def val_dataloader(self) -> list[DataLoader]:
        loaders = [self.eval_loader(index, source.retrieval, source.eval_batch_size, source.max_length,
                                    query_prefix=source.query_prefix)
                   for index, source in enumerate(self.sources.values())]
        return loaders + [self.eval_loader(index, rs, self.extra_eval_batch_size, self.extra_eval_max_length)
                          for index, (_, rs) in enumerate(self.extra_eval, start=len(loaders))]
