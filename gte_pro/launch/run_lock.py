"""One run per run folder: the run that starts first holds ``<run dir>/.run.lock`` until it ends; a second start of
the same folder is refused at once, naming the holder recorded beside the lock (``.run.lock.json``: host, process
id, start time, SLURM job id).

Why ``fcntl.flock`` on an open file, and not a lock file whose existence is the lock (or the ``filelock`` package):

- the kernel drops a flock when its process dies, however it dies (kill -9, OOM killer, a crash), so a dead holder
  never blocks the next start and no stale-lock clean-up step is needed; on NFS the client emulates flock with a
  byte-range lock that the server drops when the client's lease ends (NFSv4) or the client reboots (NFSv3/NLM);
- flock is per open file: a second start in the same process (a sweep, a test) is refused as another process is,
  where ``fcntl.lockf``'s per-process locks would let it through;
- ``filelock`` is only a transitive dependency here; its locks are re-entrant per instance and wait by polling, and
  it turns a file system without lock support into an exception of its own, where this module needs a single
  non-blocking attempt and a documented fallback (below).

Only one process of a run takes the lock: global rank 0, or the process that launches the ranks (Lightning's DDP
re-runs ``train.py`` for ranks >= 1 with ``LOCAL_RANK`` set; SLURM, torchrun and submitit set their own rank
variables). A SLURM requeue of the same job id (a new ``SLURM_RESTART_COUNT``) is the same run: the earlier start's
lock, if a vanished node still holds it, does not block it. A file system that refuses locks (NFS mounted
``nolock``, Lustre without ``flock``) falls back to the holder record alone: a live holder on this host is refused,
a holder on another host cannot be told from a dead one (docs/reliability.md, "One run per folder").
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gte_pro.errors import UserError
from gte_pro.utils.files import write_json_atomic

log = logging.getLogger(__name__)

LOCK_FILE = ".run.lock"
HOLDER_FILE = ".run.lock.json"
# the variables that give a process's rank; a run's lock belongs to the process whose ranks are all 0 (or unset)
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "NODE_RANK", "GROUP_RANK", "SLURM_PROCID", "SUBMITIT_LOCAL_GLOBALID")
# errors that say the file system cannot lock, not that someone holds the lock
NO_LOCK_SUPPORT = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


class RunFolderBusy(UserError):
    """The run folder is held by another run that is still going."""


def takes_the_lock() -> bool:
    """Whether this process holds its run's lock: global rank 0 or the launcher; other ranks of the run must not
    be refused by their own run's lock."""
    return all(os.environ.get(key, "0").strip() in ("", "0") for key in RANK_VARIABLES)


def holder_record() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
            "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT")}


def read_holder(run_dir: Path) -> dict[str, Any] | None:
    try:
        record = json.loads((run_dir / HOLDER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def describe_holder(record: dict[str, Any] | None) -> str:
    if record is None:
        return "a process that has not written its record yet"
    text = f"host {record.get('host')}, process {record.get('pid')}, started {record.get('started')}"
    return text + (f", SLURM job {record['slurm_job_id']}" if record.get("slurm_job_id") else "")


def busy_error(run_dir: Path, record: dict[str, Any] | None) -> RunFolderBusy:
    stop = f"kill -TERM {record.get('pid')} on {record.get('host')}" if record else "stop it"
    if record and record.get("slurm_job_id"):
        stop += f" or scancel {record['slurm_job_id']}"
    return RunFolderBusy(
        f"{run_dir} is in use by another run: {describe_holder(record)} (record: {run_dir / HOLDER_FILE})",
        hint=f"wait for that run to end, or stop it ({stop}: it saves a checkpoint and exits), then start this "
             f"command again; or give this run another folder (hydra.run.dir=<folder>). If that process no longer "
             f"runs (its machine vanished), delete {run_dir / LOCK_FILE} and start again")


def _same_slurm_job(record: dict[str, Any] | None) -> bool:
    """A requeued SLURM job (same id, a later SLURM_RESTART_COUNT) is the run that holds the folder, started again;
    two starts within one job and restart (two job steps) are two runs."""
    job = os.environ.get("SLURM_JOB_ID")
    return bool(job and record and record.get("slurm_job_id") == job
                and record.get("slurm_restart_count") != os.environ.get("SLURM_RESTART_COUNT"))


def _alive_here(record: dict[str, Any] | None) -> bool:
    """Whether the record names a live process on this host other than this one (the no-lock fallback)."""
    if not record or record.get("host") != socket.gethostname() or record.get("pid") == os.getpid():
        return False
    try:
        os.kill(int(record["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, KeyError):
        return True
    return True


def _open_locked(path: Path) -> int | None:
    """An fd of ``path`` holding its exclusive flock; None when another open file holds it. Raises OSError with an
    errno of NO_LOCK_SUPPORT when the file system cannot lock."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except OSError:
            os.close(fd)
            raise
        # someone deleted the lock file (to break a stale lock) between our open and flock: lock the new one
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                return fd
        except FileNotFoundError:
            pass
        os.close(fd)


def acquire(run_dir: Path) -> int | None:
    """Take ``run_dir``'s lock and write the holder record; the fd to keep open (None: the file system cannot
    lock, or a requeued SLURM job continues past its earlier start's lock). Raises RunFolderBusy when held."""
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        fd = _open_locked(run_dir / LOCK_FILE)
    except OSError as error:
        if error.errno not in NO_LOCK_SUPPORT:
            raise
        return _without_lock(run_dir, error)
    if fd is None:
        record = read_holder(run_dir)
        if not _same_slurm_job(record):
            raise busy_error(run_dir, record)
        log.warning("%s is still locked by an earlier start of SLURM job %s (%s): this is the same job requeued, "
                    "continuing", run_dir, os.environ["SLURM_JOB_ID"], describe_holder(record))
    write_json_atomic(run_dir / HOLDER_FILE, holder_record())
    return fd


def _without_lock(run_dir: Path, error: OSError) -> None:
    """The fallback where the file system refuses locks: the holder record alone, which tells a live holder only on
    this host (another host's holder cannot be told from a dead one)."""
    record = read_holder(run_dir)
    if _alive_here(record) and not _same_slurm_job(record):
        raise busy_error(run_dir, record)
    log.warning("%s: the file system cannot lock files (%s); a second run of this folder on another machine would "
                "not be refused (docs/reliability.md, One run per folder)", run_dir, os.strerror(error.errno))
    write_json_atomic(run_dir / HOLDER_FILE, holder_record())
    return None


def release(fd: int | None) -> None:
    """Drop the lock (closing the fd drops the flock). The files stay: deleting them would let a third start lock
    a new file while a second one still waits on the old."""
    if fd is not None:
        os.close(fd)


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold ``run_dir`` for the duration (rank 0 or the launcher only; the other ranks of the run pass through)."""
    if not takes_the_lock():
        yield
        return
    fd = acquire(Path(run_dir))
    try:
        yield
    finally:
        release(fd)
