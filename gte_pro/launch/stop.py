"""Stopping a run when asked: SIGTERM (``kill``, ``scancel``, a cluster's shutdown) and SIGINT (Ctrl+C).

``stop_on_signals`` (around every job, ``gte_pro.train``) catches both. Outside training's step loop the handler
raises ``RunStopped`` at once: evaluation keeps nothing to save, scoring's finished shards are already on disk (each
written atomically), mining with a teacher has kept its mined window (``gte_pro.mining.kept_window``). Inside the
step loop (``deferring``, set by ``gte_pro.launch.preemption.PreemptionCheckpoint``) it only records the request: at
the next step boundary the ranks agree, save ``last.ckpt`` together and raise ``RunStopped``, the same path as
SLURM's preemption signal. A second signal of the same run stops at once, without waiting for the step.

``gte_pro.errors.RunStopped`` is a BaseException, so that no ``except Exception`` on the way swallows it;
``gte_pro.errors.run_cli`` turns it into exit code 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a
shell reports a process killed by that signal.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gte_pro.errors import RunStopped

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopRequest:
    """The signal received by this process during the current job (None: none), and whether the training loop
    takes care of it (``deferred``) or the handler raises at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.deferred = False
        self._children: list[Any] = []  # processes this one launched (DDP ranks), which the signal is passed on to
        self.pid = os.getpid()

    def handle(self, signum: int, frame: Any) -> None:
        if os.getpid() != self.pid:
            return  # a forked DataLoader worker (Ctrl+C reaches it too): its process stops when the job's does
        again = self.signum is not None
        self.signum = signum
        self._pass_on(signum)
        if self.deferred and not again:
            log.warning("%s received: saving a checkpoint at the next step boundary, then stopping (send it again "
                        "to stop at once, without one)", signal.Signals(signum).name)
            return
        raise RunStopped(signum)

    def forward_to(self, launcher: Any) -> None:
        """Pass the signals on to the ranks ``launcher`` started (Lightning's DDP launcher re-runs ``train.py``): a
        ``kill`` reaches only this process, and a rank left behind would wait at its next collective."""
        self._children = list(getattr(launcher, "procs", None) or [])

    def _pass_on(self, signum: int) -> None:
        for child in self._children:
            with contextlib.suppress(OSError):
                child.send_signal(signum)

    def take(self) -> int | None:
        """The signal received since the last call (and forget it)."""
        signum, self.signum = self.signum, None
        return signum


STOP = StopRequest()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Install the SIGTERM/SIGINT handler for one job and restore the previous handlers after it (a sweep runs
    many jobs in one process; submitit's own SIGTERM handler ignores the signal)."""
    if threading.current_thread() is not threading.main_thread():  # only the main thread may set handlers
        yield STOP
        return
    previous = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    STOP.signum, STOP.deferred, STOP._children, STOP.pid = None, False, [], os.getpid()
    for signum in STOP_SIGNALS:
        signal.signal(signum, STOP.handle)
    try:
        yield STOP
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        STOP.deferred, STOP._children = False, []


@contextlib.contextmanager
def deferring() -> Iterator[None]:
    """Inside the training loop: a signal waits for the next step boundary (see the module doc)."""
    STOP.deferred = True
    try:
        yield
    finally:
        STOP.deferred = False


def under_submitit() -> bool:
    """True inside a job that submitit started (its SLURM and local executors both export this)."""
    return "SUBMITIT_EXECUTOR" in os.environ


def resume_command(run_dir: Path) -> str:
    """The command that continues this run in ``run_dir``: the job's own overrides (a sweep's job: its values, no
    ``-m``) and its folder."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():  # a config composed in Python (tests, a notebook): the usual entry point
        return shlex.join(["python", "train.py", f"hydra.run.dir={run_dir}"])
    overrides = [o for o in HydraConfig.get().overrides.task if not o.startswith("hydra.run.dir=")]
    entry = "train.py" if under_submitit() else sys.argv[0]  # a job's argv[0] is submitit's own _submit.py
    return shlex.join(["python", entry, *overrides, f"hydra.run.dir={run_dir}"])
