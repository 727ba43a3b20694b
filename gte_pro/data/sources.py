"""Where a data module's rows come from: a row source says how to read its rows and how to tell when they changed;
the token cache (``gte_pro.data.token_cache``) cleans, splits and tokenizes them. One class per kind, each in its
source's module: ``demo.DemoRows``, ``jsonl.JsonlRows``, ``hf.HfRows``, ``beir_rows.BeirRows`` (``data.<kind>``'s
``_target_``, built with that option's own keys)."""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

from gte_pro.data.records import Example

if TYPE_CHECKING:
    from gte_pro.data.token_cache import TokenCache


class RowSource(abc.ABC):
    """A source of (query, positives[, negatives]) rows."""

    # the name of the data module class each source had before the data module was made of parts: part of the token
    # cache's key (caches built then stay valid), of data errors and of the model card's data source
    module_name: ClassVar[str]

    @abc.abstractmethod
    def load_rows(self, tokens: TokenCache) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        """(training rows, validation rows or None to split them off the training rows, distractor documents),
        cleaned through ``tokens`` (``tokens.clean``, ``tokens.clean_validation``, ``tokens.record``).

        The training rows may be a generator: they are streamed once into the token cache, never held in memory.
        """

    def signature(self, tokens: TokenCache) -> Any:
        """A JSON-able value that changes whenever the source's rows do (e.g. ``cache.file_signature`` of the
        files): part of the token cache's key. None: no stable identity (a private cache per process)."""
        return None

    def has_teacher_scores(self) -> bool:
        """Whether the rows carry teacher scores (``gte_pro.data.scores``): then the token cache's key says so, so
        that a cache built before scores were read (or from the rows without them) is not reused."""
        return False

    def where(self) -> str:
        """What the source's data errors name (its file or folder)."""
        return self.module_name

    @property
    def val_file(self) -> str | None:
        """A validation file of the source's own (None: validation rows are held out by the query's hash, or come
        from a split the source names)."""
        return None
