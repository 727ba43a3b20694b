"""The one place that says where gte-pro keeps what it builds and fetches (token caches, the demo corpus, tokenized
BEIR corpora, the tiny tokenizer, fetched models): ``paths.cache_dir`` when a run sets it, else ``$GTE_PRO_CACHE``,
else ``~/.cache/gte_pro``. conf/paths/default.yaml reads the same function (``${cache_root:}``)."""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "GTE_PRO_CACHE"
DEFAULT_CACHE = "~/.cache/gte_pro"


def cache_root(configured: str | os.PathLike[str] | None = None) -> Path:
    """The cache folder, ``~`` expanded: ``configured`` (a run's paths.cache_dir or data.cache_dir), else
    ``$GTE_PRO_CACHE``, else ~/.cache/gte_pro."""
    return Path(configured or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()
