"""Docstrings read from Python source with ``ast``: nothing is imported, so no module's side effects run and a
package that needs a GPU, a compiler or a network to import still yields its documentation.

Shared by ``data=demo`` (the standard library) and ``gte_pro.data.pydocs`` (installed third-party packages).
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from pathlib import Path


def parse_source(path: Path) -> ast.Module | None:
    """The syntax tree of a source file, or None when it cannot be read or parsed (other Python versions)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences in old sources
            return ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, UnicodeDecodeError, OSError, ValueError):
        return None


def parsed_sources(root: Path, skip_parts: set[str] | frozenset[str]) -> Iterator[tuple[Path, ast.Module]]:
    """(path, tree) of every parsable ``*.py`` under ``root`` whose path has no part (folder or file name) in
    ``skip_parts``, in sorted order (the data built from them must not depend on the file system's listing order)."""
    for path in sorted(root.rglob("*.py")):
        if skip_parts.intersection(path.relative_to(root).parts):
            continue
        tree = parse_source(path)
        if tree is not None:
            yield path, tree


def docstring_pair(doc: str) -> tuple[str, str] | None:
    """(summary paragraph, rest) of a docstring, or None when it has no body."""
    paragraphs = [p for p in doc.split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return None
    return paragraphs[0], "\n\n".join(paragraphs[1:])
