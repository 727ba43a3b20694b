"""Atomic writes: a file or folder appears complete or not at all, never half-written.

Each writer fills a temporary sibling (same folder, so the final rename stays on one file system), flushes it to
disk and renames it over the target. A crash, a full disk or an unwritable folder leaves the previous version in
place, removes the temporary files, and raises :class:`WriteError` naming the target and the cause
("could not write <path>: No space left on device (errno 28)").

The flush (``fsync``) before the rename matters for a full disk: file systems with delayed allocation accept
``write()`` into the page cache and only fail at writeback; without it the rename could put a file whose data
never reached the disk over a good one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from gte_pro.errors import FULL_DISK, UserError, free_space
from gte_pro.utils.shared_cache import TEMPORARY, process_alive, record_checksums


class WriteError(UserError, OSError):
    """A write that failed and left the previous version in place: names the target path (not the temporary
    one) and the cause. An ``OSError`` with the cause's ``errno`` (None when the cause was not an OS error)."""

    hint = "free space or fix the permissions there, then run the same command again (nothing earlier was lost)"

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        # read when the write failed: what the user must free is what was missing then
        self.free = free_space(self.filename) if self.errno in FULL_DISK else None

    def __str__(self) -> str:
        cause = f"{self.strerror} (errno {self.errno})" if self.errno is not None else str(self.strerror)
        return f"could not write {self.filename}: {cause}" + (f"; {self.free}" if self.free else "")



def write_error(target: str | Path, error: OSError) -> WriteError:
    """``error`` (raised while writing ``target``) as a :class:`WriteError` naming ``target``."""
    return WriteError(error.errno, error.strerror or str(error), str(target))


@contextlib.contextmanager
def writes_to(path: str | Path) -> Iterator[None]:
    """OS errors inside the block (a full disk, a folder that cannot be written) as a ``WriteError`` naming
    ``path``, the file being written, and the cause."""
    try:
        yield
    except OSError as error:
        if isinstance(error, WriteError):
            raise
        raise write_error(path, error) from error


class CheckedSink:
    """A binary file being written piece by piece (a store's data file): an OS error of its opening, of any write or
    of its closing is a ``WriteError`` naming the file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with writes_to(path):
            self.handle = open(path, "wb")  # noqa: SIM115 - closed by close() / __exit__

    def write(self, data: bytes) -> None:
        with writes_to(self.path):
            self.handle.write(data)

    def close(self) -> None:
        with writes_to(self.path):
            self.handle.close()

    def __enter__(self) -> CheckedSink:
        return self

    def __exit__(self, kind: Any, *_: Any) -> None:
        if kind is None:
            self.close()
        else:  # already failing: release the file without hiding the first error
            with contextlib.suppress(OSError):
                self.handle.close()


def temporary_sibling(target: Path, suffix: str = "") -> Path:
    """``<target>.tmp<pid><suffix>``: unique per process, so concurrent ranks never write the same temp path."""
    return target.with_name(f"{target.name}.tmp{os.getpid()}{suffix}")


def make_folder(folder: Path) -> None:
    """``mkdir -p``; a file in the way is reported as such (``mkdir`` itself says "File exists")."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except FileExistsError as error:
        raise NotADirectoryError(errno.ENOTDIR, f"{os.strerror(errno.ENOTDIR)}: {folder} is a file") from error


@contextlib.contextmanager
def published_folder(folder: Path, marker: str = "meta.json") -> Iterator[Path]:
    """The one atomic publish of a store (token cache, corpus stores): the block fills an empty temporary sibling
    of ``folder`` (yielded); when it ends without an error the build is flushed and renamed to ``folder``. A store is
    never replaced: if another process (a DDP rank on another node) published first (``folder/marker`` exists),
    theirs is kept. Every file's size and checksum go into ``checksums.json`` (``gte_pro.utils.shared_cache``,
    which checks them before a store is read). Whatever happens, no temporary folder is left; a failed write is a
    ``WriteError`` naming ``folder``."""
    tmp = temporary_folder(folder)
    try:
        yield tmp
        publish(tmp, folder, marker)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def temporary_folder(folder: Path) -> Path:
    """An empty build folder beside ``folder`` (the same naming as every other atomic write)."""
    tmp = temporary_sibling(folder)
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        make_folder(tmp)
    except OSError as error:
        raise write_error(folder, error) from error
    return tmp


def publish(tmp: Path, folder: Path, marker: str = "meta.json") -> None:
    """Flush a finished build to disk and rename it into place; if another process won (``folder/marker`` exists),
    keep theirs. A full disk that only shows at the flush fails here, before the build is published."""
    try:
        record_checksums(tmp)
        fsync_tree(tmp)
        tmp.rename(folder)
    except OSError as error:
        if not (folder / marker).is_file():
            raise write_error(folder, error) from error
        shutil.rmtree(tmp, ignore_errors=True)


def fsync_tree(path: Path) -> None:
    """Flush a file, or every file of a folder and the folder itself, to disk (errors of a full disk surface
    here, before anything is renamed)."""
    if path.is_dir() and not path.is_symlink():
        for child in path.rglob("*"):
            if child.is_file() and not child.is_symlink():
                fsync_tree(child)
        fsync_folder(path)
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_folder(folder: Path) -> None:
    """Make renames in ``folder`` durable; some file systems refuse fsync on a folder, which loses nothing else."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def replace_path(tmp: Path, target: Path) -> None:
    """Swap a finished temporary file or folder in for ``target``.

    A file is replaced by one atomic rename. A folder cannot be renamed over a non-empty one, so the old folder is
    first moved aside (``<target>.tmp<pid>.old``), and moved back if the new one cannot take its place.
    """
    if not (target.is_dir() and not target.is_symlink()):
        os.replace(tmp, target)
        return
    old = temporary_sibling(target, ".old")
    _remove(old)
    os.replace(target, old)
    try:
        os.replace(tmp, target)
    except BaseException:
        os.replace(old, target)
        raise
    _remove(old)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def _discard(path: Path) -> None:
    """Clean up after a failed write; a path that cannot even be looked at (its parent is a file) holds nothing."""
    try:
        _remove(path)
    except OSError:
        pass


def write_atomic(target: str | Path, fill: Callable[[Path], Any], suffix: str = "") -> Path:
    """Call ``fill(tmp)`` to write a file or folder at a temporary path, then flush and rename it to ``target``.

    Raises :class:`WriteError` (naming ``target`` and the cause) when the folder cannot be made or anything in the
    write fails with an OS error; other exceptions of ``fill`` keep their type and get a note naming ``target``.
    Either way the temporary files are gone and the previous ``target`` is untouched.
    """
    target = Path(target)
    tmp = temporary_sibling(target, suffix)
    try:
        make_folder(target.parent)
        _remove(tmp)  # left by a killed process that had the same pid
        fill(tmp)
        fsync_tree(tmp)
        replace_path(tmp, target)
    except OSError as error:
        _discard(tmp)
        raise write_error(target, error) from error
    except BaseException as error:
        _discard(tmp)
        if isinstance(error, Exception) and hasattr(error, "add_note"):  # Python >= 3.11
            # not an OS error (torch.save reports a full disk as a RuntimeError): same type, plus the path
            error.add_note(f"could not write {target} (the previous version, if any, is unchanged)")
        raise
    fsync_folder(target.parent)
    return target


def write_text_atomic(target: str | Path, text: str) -> Path:
    return write_atomic(target, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def write_json_atomic(target: str | Path, blob: Any) -> Path:
    return write_text_atomic(target, json.dumps(blob, indent=2) + "\n")


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Remove the temporary siblings (``<name>.tmp<pid>...``) in ``folder`` left by processes that no longer run:
    a kill -9 during a write leaves one behind, with nobody to clean up but the next run. Returns what went."""
    if not folder.is_dir():
        return []
    stale = [path for path in folder.iterdir()
             if (found := TEMPORARY.search(path.name)) and not process_alive(int(found.group(1)))]
    for path in stale:
        _discard(path)
    return stale
