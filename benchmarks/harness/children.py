"""Fresh processes: a command (``run_command``, ``run_train``) or a function of a benchmark file (``run_child``), its
peak RSS seen from outside, and a one-line reason when it fails (a crash, the OOM killer, a time-out)."""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

Result = dict[str, Any]  # one measurement; ``{"error": reason, ...}`` when it failed
REPO = Path(__file__).resolve().parents[2]
CHILD_ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}  # defaults; the caller's environment wins
# train.py must not reach for a hub or a W&B server, whatever the caller's environment says
TRAIN_ENV = {**CHILD_ENV, "WANDB_MODE": "offline"}
_CHILD = Path(__file__).with_name("child.py")
_POLL_S = 0.05
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b")


def failure_reason(returncode: int, output: str) -> str:
    """A one-line reason from a child's exit status and its output: the signal, or the last exception line."""
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else "?"
        hint = " (out of memory?)" if -returncode == signal.SIGKILL else ""
        return f"killed by signal {-returncode} {name}{hint}"
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    cause = next((ln for ln in reversed(lines) if _EXCEPTION_LINE.match(ln)), lines[-1] if lines else "no output")
    return f"exit code {returncode}: {cause[:240]}"


def _wait(proc: subprocess.Popen, timeout: float | None) -> tuple[int | None, float]:
    """(exit code, or None when killed at ``timeout``; the child's peak RSS in MB). ``wait4`` rather than
    ``Popen.wait``: it also returns the child's resource usage, hence its peak RSS from outside."""
    deadline = None if timeout is None else time.monotonic() + timeout
    timed_out = False
    while True:
        pid, status, usage = os.wait4(proc.pid, 0 if timed_out else os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait for a reaped child
            return (None if timed_out else proc.returncode), usage.ru_maxrss / 1024
        if deadline is not None and time.monotonic() > deadline:
            with suppress(ProcessLookupError):  # it may have exited since the poll
                os.killpg(proc.pid, signal.SIGKILL)  # the child's own session: it and anything it started
            timed_out = True
            continue
        time.sleep(_POLL_S)


def run_command(cmd: Sequence[str], log: Path, timeout: float | None = None, cwd: Path | None = None,
                env: Mapping[str, str] | None = None) -> Result:
    """Run ``cmd`` (stdout and stderr to ``log``): ``{"wall_s", "peak_rss_mb"}`` or ``{"error", "log_tail"}``."""
    full_env = {**CHILD_ENV, **os.environ, **(env or {})}
    start = time.perf_counter()
    with log.open("w") as out:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=full_env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        code, peak_rss = _wait(proc, timeout)
    wall = time.perf_counter() - start
    tail = log.read_text(errors="replace")[-3000:]
    if code is None:
        return {"error": f"timed out after {timeout:g} s", "log_tail": tail}
    if code:
        return {"error": failure_reason(code, tail), "log_tail": tail}
    return {"wall_s": wall, "peak_rss_mb": peak_rss}


def train_command(*overrides: str) -> list[str]:
    """``python train.py OVERRIDES...`` with this interpreter (run from the checkout, ``run_train``)."""
    return [sys.executable, "train.py", *overrides]


def run_train(cmd: Sequence[str], log: Path, timeout: float | None = None, repo: Path = REPO) -> Result:
    """``run_command`` for ``train.py`` in the checkout ``repo``: offline (no hub, no W&B server)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    return run_command(cmd, log, timeout, cwd=repo, env=TRAIN_ENV)


def run_child(function: Callable[[dict[str, Any]], Result], payload: Mapping[str, Any], work: Path,
              timeout: float | None = None) -> Result:
    """``function(payload)`` in a fresh process; its result, or ``{"error": reason, "log_tail": ...}``.

    ``function`` must be a module-level function of a file the child can import by path (a benchmark script)."""
    fd, name = tempfile.mkstemp(suffix=".json", dir=work)
    os.close(fd)
    result_file, log = Path(name), Path(name).with_suffix(".log")
    cmd = [sys.executable, str(_CHILD), inspect.getfile(function), function.__name__, json.dumps(dict(payload)),
           str(result_file)]
    outcome = run_command(cmd, log, timeout)
    text, tail = result_file.read_text(), log.read_text(errors="replace")[-3000:]
    result_file.unlink(missing_ok=True)
    log.unlink(missing_ok=True)
    if "error" in outcome:
        return outcome
    if not text:  # exit code 0 without a result: something ended the child before the function returned
        return {"error": failure_reason(0, tail), "log_tail": tail}
    return json.loads(text)
