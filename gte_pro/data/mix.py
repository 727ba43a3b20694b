"""``data=mix``: several sources in one run, each batch drawn from one source with p_i proportional to n_i ** alpha
(the GTE paper's multi-source sampling) or to explicit weights.

Each source is a data module of its own (``jsonl``, ``hf``, ``beir``, ``demo``: its own row source, token cache,
cleaning and validation split), built by ``gte_pro.modes.build_data`` with the mix's shared ``data.*`` keys
unless its spec sets them. Training draws from all of them through one ``MixSampler``
(``gte_pro.data.mix_sampling``) under the mix's batching; validation scores each source's held-out split as the
named set ``<source>`` and logs their mean as ``val/<metric>`` (the monitored ``val/ndcg@10``).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from lightning.pytorch import LightningDataModule
from omegaconf import OmegaConf
from torch.utils.data import DataLoader

from gte_pro.data.base import ContrastiveDataModule, PartsView, TrainingPosition
from gte_pro.data.batching import Batching
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.mix_sampling import MixedPairs, MixSampler, offsets_of, source_probabilities
from gte_pro.data.records import Example
from gte_pro.data.sampling import ResumableLoader
from gte_pro.data.token_cache import Tokenization
from gte_pro.data.validation import Validation
from gte_pro.errors import DataError
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)

# one batch layout, tokenizer and loader for the whole mix: a source cannot set these (a source may set its
# cleaning, split, max_length, eval_batch_size, cache_dir, its own query instruction (query_prefix, in place of the
# model's: a decoder embedder's "Instruct: <task>\nQuery: " per task) and, with same_source_batches, num_negatives)
MIX_ONLY = frozenset({"tokenizer", "batch_size", "seed", "doc_prefix", "num_workers", "pin_memory",
                      "persistent_workers", "group_by_length", "length_window"})
_NAME = re.compile(r"[A-Za-z0-9_-]+")  # a source's name is part of its metric keys: val/<name>/ndcg@10


def _plain(value: Any) -> Any:
    return OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value


def check_source_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise DataError(f"data.sources.{name}: a source name may only hold letters, digits, '_' and '-' (it names "
                        "the metrics val/<name>/...)")


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
def named_errors(name: str) -> Iterator[None]:
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


@dataclass(frozen=True)
class Mixing:
    """How the sources are drawn: ``weights`` (name -> weight, or a list in the sources' order; None: p_i
    proportional to n_i ** ``alpha``), and whether a global batch comes from one source (``same_source_batches``)."""

    weights: Any
    alpha: float
    same_source_batches: bool

    module_name: ClassVar[str] = "MixDataModule"  # as model cards name a mix's source (gte_pro.data.sources)


class MixDataModule(PartsView, TrainingPosition, LightningDataModule):
    """Several sources (name -> data module), each batch from one of them (``same_source_batches``) or mixed row
    by row, batched by ``batching``; validation: each source's held-out split, then ``validation``'s named sets.

    An epoch is ``sum(n_i) // (batch_size x devices)`` steps, n_i the source's training rows after cleaning.
    ``batch["rows"]`` are global rows: source i's rows follow those of the sources before it (``train_rows`` reads
    them back).
    """

    batches_from_train_sampler = False  # its own sampler over the sources' caches (train_dataloader)

    def __init__(self, sources: Mapping[str, ContrastiveDataModule], mixing: Mixing, batching: Batching,
                 validation: Validation, form: Tokenization) -> None:
        super().__init__()
        if not sources:
            raise DataError("data.sources: expected at least one source")
        self.sources = dict(sources)
        self.batching = batching
        self.validation = validation
        self.form = form  # the named sets' tokenization (the model's prompts)
        self.alpha = float(mixing.alpha)
        self.same_source_batches = mixing.same_source_batches
        check_same_negatives(self.sources, self.same_source_batches)
        self.weights = check_weights(mixing.weights, list(self.sources))
        # the module logs the mean of these sets' metrics as val/<metric> (the first set is not the held-out one)
        self.averaged_sets = list(self.sources)
        self.source_rows: dict[str, int] = {}
        self.probabilities: dict[str, float] = {}
        self.reports: list[dict[str, Any]] = []
        self.decontamination: dict[str, Any] | None = None
        self.distill_loss = next(iter(self.sources.values())).distill_loss

    @property
    def num_negatives(self) -> int | None:
        """One number where every source has the same (null until setup reads a file's own count)."""
        counts = {source.num_negatives for source in self.sources.values()}
        return counts.pop() if len(counts) == 1 else None

    def prepare_data(self) -> None:
        for name, source in self.sources.items():
            with named_errors(name):
                source.prepare_data()

    def setup(self, stage: str | None = None) -> None:
        if self.source_rows:
            return
        for name, source in self.sources.items():
            with named_errors(name):
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
        batching = self.batching
        for name, rows in self.source_rows.items():
            if self.probabilities[name] > 0:
                batching.check_rows(rows, world_size, f"data.sources.{name}: ",
                                    f"lower the batch size, add data or give it data.weights.{name}=0")
        sources = list(self.sources.values())
        pairs = MixedPairs([TokenizedPairs(s.token_cache.token_rows(), s.num_negatives, batching.seed)
                            for s in sources])
        lengths = [s.token_cache.lengths() for s in sources] if batching.group_by_length else None
        sampler = MixSampler(list(self.source_rows.values()), list(self.probabilities.values()),
                             batching.batch_size, world_size, rank, batching.seed, self.same_source_batches, lengths,
                             batching.length_window)
        collate = batching.collate(self.form.require_tokenizer(), any(s.token_cache.scored for s in sources))
        return self._serve(ResumableLoader(pairs, sampler, batch_size=batching.batch_size, drop_last=True,
                                           collate_fn=collate, **batching.loader.kwargs()))

    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        clash = sorted({name for name, _ in sets} & set(self.sources))
        if clash:
            raise DataError(f"eval.beir: the set name(s) {', '.join(clash)} are also data.sources names: both would "
                            "log val/<name>/...; name the BEIR set otherwise ({path: ..., name: ...})")
        self.validation.add_eval_sets(sets, batch_size, max_length)

    @property
    def extra_eval(self) -> list[tuple[str, RetrievalSet]]:
        return self.validation.named_sets(self.form)

    def validation_sets(self) -> list[tuple[str, RetrievalSet]]:
        """Each source's held-out split under its name, then the eval.beir sets."""
        assert self.source_rows, "setup() first"
        return [(name, source.retrieval) for name, source in self.sources.items()] + list(self.extra_eval)

    def val_dataloader(self) -> list[DataLoader]:
        first = [(source.retrieval, source.eval_batch_size, source.max_length, source.query_prefix)
                 for source in self.sources.values()]
        return self.validation.loaders(first, self.form)
