"""Caches that several processes share (token caches, corpus stores, the tiny tokenizer, the demo corpus): built once
between them, and checked before they are read.

- **One build at a time per folder.** ``shared_folder`` builds under an exclusive ``fcntl.flock`` on
  ``<folder>.lock`` beside the folder. A second process that needs the same folder waits on the lock (one log line
  says so) and, once it holds it, finds the finished folder and reuses it: one build between them. The lock file is
  removed by its holder when the build ends; a waiter that then holds the lock of a removed file takes the new one
  (as ``gte_pro.launch.run_lock`` does). The kernel drops the lock of a killed holder. A file system that cannot
  lock falls back to building without it: two identical builds, the first one published is kept
  (``gte_pro.utils.files.publish``), none fails.
- **Damage is detected, never read as data.** ``published_folder`` records every file's size and xxh3-64 in
  ``checksums.json`` when it publishes a build; ``shared_folder`` checks them before the folder is used (once per
  process and folder) and rebuilds a folder whose files are missing, truncated, grown or changed, after one log line
  naming the file and what was wrong. A folder without ``checksums.json`` is treated as damaged: the caches' keys
  changed when checksums came in, so only damage (or a hand-made folder) leaves one without it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import glob
import json
import logging
import os
import re
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import xxhash

log = logging.getLogger(__name__)

CHECKSUMS = "checksums.json"
BLOCK = 8 << 20  # bytes read at a time while hashing: a large file is never held whole
# errors that say the file system cannot lock, not that someone holds the lock
NO_LOCK_SUPPORT = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)
# the temporary siblings of atomic writes (files.temporary_sibling): <name>.tmp<pid><suffix>
TEMPORARY = re.compile(r"\.tmp(\d+)")
# folders this process has checked, with their files' names, sizes, inodes and times (a changed one is checked again)
_verified: dict[Path, tuple[tuple[str, int, int, int], ...] | None] = {}


def file_checksum(path: Path) -> str:
    """xxh3-64 of a file's bytes, read a block at a time (~3 GB/s from the page cache on 2 EPYC cores)."""
    digest = xxhash.xxh3_64()
    buffer = bytearray(BLOCK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as handle:
        while read := handle.readinto(buffer):
            digest.update(view[:read])
    return digest.hexdigest()


def record_checksums(folder: Path) -> None:
    """Write ``folder/checksums.json``: the size and xxh3-64 of every file under ``folder`` (before it is
    published)."""
    files = {str(p.relative_to(folder)): {"size": p.stat().st_size, "xxh3": file_checksum(p)}
             for p in sorted(folder.rglob("*")) if p.is_file() and p.name != CHECKSUMS}
    (folder / CHECKSUMS).write_text(json.dumps({"algorithm": "xxh3_64", "files": files}, indent=1))


def damage(folder: Path) -> str | None:
    """What is wrong with a published ``folder`` (one phrase naming the file), or None when every file has its
    recorded size and checksum."""
    try:
        record = json.loads((folder / CHECKSUMS).read_text())
        files = record["files"]
    except FileNotFoundError:  # the caches' keys changed with checksums: only the tiny tokenizer's can be older
        return f"{CHECKSUMS} is missing (built before checksums were recorded, or damaged)"
    except (OSError, ValueError, KeyError, TypeError) as error:
        return f"{CHECKSUMS} is unreadable ({type(error).__name__}; damaged)"
    for name, expected in files.items():
        path = folder / name
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return f"{name} is missing (damaged)"
        if size != expected["size"]:
            return f"{name} is {size} bytes, expected {expected['size']} (damaged)"
    for name, expected in files.items():  # sizes first: a truncated file is named without reading anything
        if file_checksum(folder / name) != expected["xxh3"]:
            return f"{name} has changed bytes (damaged: its xxh3 differs from the one recorded at build time)"
    return None


def _identity(folder: Path) -> tuple[tuple[str, int, int, int], ...] | None:
    """The files' names, sizes, inodes and modification times: a folder checked once in this process is not hashed
    again while these stay the same (a rebuilt, truncated or rewritten file changes them)."""
    try:
        return tuple((str(p), (st := p.stat()).st_size, st.st_ino, st.st_mtime_ns)
                     for p in sorted(folder.rglob("*")) if p.is_file())
    except OSError:
        return None


MISSING = "not built yet"


def problem_of(folder: Path, marker: str) -> str | None:
    """None when ``folder`` is published and undamaged (checked once per process while it stays the same), else
    what is wrong (``MISSING`` when it is not there)."""
    if not (folder / marker).is_file():
        # a folder without its marker was not published whole: renaming a build onto it would fail
        return f"{marker} is missing (damaged)" if os.path.lexists(folder) else MISSING
    identity = _identity(folder)
    if identity is not None and _verified.get(folder) == identity:
        return None
    problem = damage(folder)
    if problem is None:
        _verified[folder] = identity
    return problem


def discard(folder: Path) -> None:
    """Move a damaged folder out of the way (one rename: a reader that has its files open keeps them), then
    delete it."""
    aside = folder.with_name(f"{folder.name}.tmp{os.getpid()}.damaged")
    with contextlib.suppress(FileNotFoundError):
        os.replace(folder, aside)
    if aside.is_dir() and not aside.is_symlink():
        shutil.rmtree(aside, ignore_errors=True)
    else:  # a file where the folder should be
        aside.unlink(missing_ok=True)
    _verified.pop(folder, None)


def shared_folder(folder: Path, build: Callable[[Path], object], what: str, marker: str = "meta.json") -> Path:
    """``folder``, checked, or built by ``build(folder)`` (which publishes it with ``published_folder``) under the
    folder's lock: whichever process comes first builds, the others wait and reuse its build. ``what`` names the
    cache in log lines ("token cache")."""
    if problem_of(folder, marker) is None:
        return folder
    with build_lock(folder, what) as locked:
        # checked again under the lock: the process we waited for may have built or repaired it; a damaged folder
        # is only removed under the lock, never one that another process has just published
        if (problem := problem_of(folder, marker)) is not None:
            if problem != MISSING:
                log.warning("%s %s: %s; rebuilding it", what, folder, problem)
                discard(folder)
            if locked:
                remove_leftovers(folder, what)
            build(folder)
            _verified[folder] = _identity(folder)
    return folder


def remove_leftovers(target: Path, what: str) -> None:
    """Delete ``<target>.tmp<pid>*``: the temporary folders or files of builds that were killed. Called with the lock
    held, when no build of ``target`` can be going on; a leftover whose process runs on this host is kept all the same
    (the rule of ``files.remove_stale_temporaries``), for mounts whose locks do not reach every process."""
    siblings = target.parent.glob(glob.escape(target.name) + ".tmp*")
    leftovers = sorted(path for path in siblings if (pid := TEMPORARY.match(path.name[len(target.name):]))
                       and not process_alive(int(pid.group(1))))
    for path in leftovers:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    if leftovers:
        log.info("%s %s: removed what a killed build left: %s", what, target, ", ".join(p.name for p in leftovers))


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


@contextlib.contextmanager
def build_lock(folder: Path, what: str) -> Iterator[bool]:
    """Hold the exclusive lock ``<folder>.lock`` for the block (yields True; False where the file system cannot
    lock); waiting for another process is logged once."""
    lock = folder.with_name(folder.name + ".lock")
    try:
        lock.parent.mkdir(parents=True, exist_ok=True)
        fd = _locked(lock, what, folder)
    except OSError as error:
        if error.errno not in NO_LOCK_SUPPORT:
            raise
        log.info("%s %s: the file system cannot lock %s (%s); building without the lock", what, folder, lock,
                 os.strerror(error.errno))
        with contextlib.suppress(OSError):  # nobody can hold a lock there: the file is only in the way
            os.unlink(lock)
        yield False
        return
    try:
        yield True
    finally:
        with contextlib.suppress(OSError):  # removed while held: a waiter on this inode sees it gone and retries
            os.unlink(lock)
        os.close(fd)


def _locked(lock: Path, what: str, folder: Path) -> int:
    """An fd of ``lock`` holding its exclusive flock, waiting for the holder if there is one."""
    waited = False
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if not waited:
                    log.info("%s %s: another process is building it; waiting for its lock %s", what, folder, lock)
                    waited = True
                fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(FileNotFoundError):
            if os.stat(lock).st_ino == os.fstat(fd).st_ino:
                return fd
        os.close(fd)  # the holder removed the file we locked: lock the current one


def seal(payload: bytes) -> bytes:
    """``payload`` behind a one-line header of its size and xxh3-64: a single-file cache that checks itself."""
    header = {"size": len(payload), "xxh3": xxhash.xxh3_64_hexdigest(payload)}
    return json.dumps(header).encode() + b"\n" + payload


def unseal(path: Path) -> tuple[bytes | None, str | None]:
    """(payload, None) of a sealed file, or (None, what is wrong: ``MISSING`` when there is no file)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None, MISSING
    head, _, payload = data.partition(b"\n")
    try:
        header = json.loads(head)
        size, checksum = int(header["size"]), str(header["xxh3"])
    except (ValueError, KeyError, TypeError):
        return None, "its checksum header is unreadable (damaged, or written before files were sealed)"
    if len(payload) != size:
        return None, f"it holds {len(payload)} bytes of data, expected {size} (damaged)"
    if xxhash.xxh3_64_hexdigest(payload) != checksum:
        return None, "it has changed bytes (damaged: its xxh3 differs from the one recorded at build time)"
    return payload, None


def shared_file(path: Path, build: Callable[[Path], object], what: str) -> bytes:
    """The payload of the sealed file ``path``, checked, or written by ``build(path)`` (atomically, with ``seal``)
    under the file's lock: the file counterpart of ``shared_folder``."""
    payload, problem = unseal(path)
    if payload is not None:
        return payload
    with build_lock(path, what) as locked:
        payload, problem = unseal(path)
        if payload is None:
            if problem != MISSING:
                log.warning("%s %s: %s; rebuilding it", what, path, problem)
                path.unlink(missing_ok=True)
            if locked:
                remove_leftovers(path, what)
            build(path)
            payload, problem = unseal(path)
    if payload is None:
        raise RuntimeError(f"{path}: {problem} right after it was written")
    return payload
