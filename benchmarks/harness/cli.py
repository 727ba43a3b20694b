"""The options the benchmarks share, each with one name and one meaning everywhere; a benchmark picks the ones it
takes and their defaults."""

from __future__ import annotations

import argparse
import os

CACHE_DIR = os.environ.get("GTE_PRO_CACHE", "~/.cache/gte_pro")


def parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's parser: ``--help`` prints its whole docstring (what it measures and how), as written."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def add_common(parser: argparse.ArgumentParser, *, batch_size: int | None = None, max_length: int | None = None,
               rounds: int | None = None, timeout: float | None = None, timeout_of: str | None = "process",
               cache_dir: bool = False, workdir: str | None = None, json: str = "write every raw result to this file",
               ) -> argparse.ArgumentParser:
    """Adds ``--json`` and, where given, ``--batch-size``, ``--max-length``, ``--rounds`` (interleaved rounds,
    medians), ``--timeout`` (seconds per ``timeout_of`` before it is killed; None: no ``--timeout``; ``timeout``
    its default), ``--cache-dir`` (the demo corpus's cache) and ``--workdir`` (its default)."""
    if batch_size is not None:
        parser.add_argument("--batch-size", type=int, default=batch_size)
    if max_length is not None:
        parser.add_argument("--max-length", type=int, default=max_length)
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help="interleaved rounds (medians reported)")
    if timeout_of:
        parser.add_argument("--timeout", type=float, default=timeout,
                            help=f"seconds per {timeout_of} before it is killed")
    if cache_dir:
        parser.add_argument("--cache-dir", default=CACHE_DIR, help="where the demo corpus is cached")
    if workdir:
        parser.add_argument("--workdir", default=workdir)
    parser.add_argument("--json", help=json)
    return parser


def int_list(text: str) -> list[int]:
    """``"10000,200000"`` -> ``[10000, 200000]``."""
    return [int(item) for item in text.split(",") if item.strip()]
