"""Atomic writes: a file or folder appears complete or not at all, never half-written.

Each writer fills a temporary sibling (same folder, so the final rename stays on one file system) and renames it
over the target; a crash or a full disk leaves the previous version in place and removes the temporary one.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any


def temporary_sibling(target: Path, suffix: str = "") -> Path:
    """``<target>.tmp<pid><suffix>``: unique per process, so concurrent ranks never write the same temp path."""
    return target.with_name(f"{target.name}.tmp{os.getpid()}{suffix}")


def replace_path(tmp: Path, target: Path) -> None:
    """Swap a finished temporary file or folder in for ``target`` (an existing folder is removed first)."""
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    tmp.replace(target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def write_atomic(target: str | Path, fill: Callable[[Path], Any], suffix: str = "") -> Path:
    """Call ``fill(tmp)`` to write a file or folder at a temporary path, then rename it to ``target``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_sibling(target, suffix)
    _remove(tmp)
    try:
        fill(tmp)
        replace_path(tmp, target)
    except BaseException:
        _remove(tmp)
        raise
    return target


def write_text_atomic(target: str | Path, text: str) -> Path:
    return write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(target: str | Path, blob: Any) -> Path:
    return write_text_atomic(target, json.dumps(blob, indent=2) + "\n")
