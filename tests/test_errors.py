"""A user's mistake ends in one message and exit code 2; a bug keeps its traceback (gte_pro.errors).

The fuzz suite (tests/test_fuzz.py) holds every expected error of its 394 inputs to ``explain``'s two lines; these
tests check the command line itself: what ``python train.py`` prints and the exit code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gte_pro.errors import (
    EXIT_USER_ERROR,
    SHOW_TRACEBACK,
    ConfigError,
    DataError,
    exit_on_user_error,
    explain,
)
from tests.conftest import REPO


def _train(args: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", SHOW_TRACEBACK)}
    return subprocess.run([sys.executable, "train.py", *args, f"hydra.run.dir={tmp_path / 'run'}"], cwd=REPO,
                          env={**environ, "HF_HUB_OFFLINE": "1", **env}, capture_output=True, text=True, timeout=300)


def _error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [line for line in proc.stderr.splitlines() if line.strip()]


@pytest.fixture
def array_on_line_4(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text('{"query": "a", "positive": "b"}\n' * 3 + '["a JSON array", "not an object"]\n')
    return path


def test_a_data_mistake_prints_two_lines_and_exits_2(tmp_path, array_on_line_4):
    proc = _train(["debug=fast", "data=jsonl", f"data.train_file={array_on_line_4}"], tmp_path)
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    what, fix = _error_lines(proc)  # nothing else on stderr: no Hydra "Error executing job" line either
    assert what == f"error: {array_on_line_4}, line 4: expected a JSON object, got list"
    assert fix.startswith("  fix: ") and "HYDRA_FULL_ERROR=1" in fix


def test_an_unknown_key_fails_before_the_job_with_two_lines(tmp_path):
    proc = _train(["modle=tiny"], tmp_path)
    assert proc.returncode == EXIT_USER_ERROR, proc.stderr
    what, fix = _error_lines(proc)
    # the fix names the group the user meant, not `+modle=tiny`, which would only add the typo (issue 42)
    assert "'modle'" in what and "did you mean model=tiny?" in fix and "+modle" not in fix


def test_hydra_full_error_shows_the_traceback(tmp_path, array_on_line_4):
    proc = _train(["debug=fast", "data=jsonl", f"data.train_file={array_on_line_4}"], tmp_path,
                  HYDRA_FULL_ERROR="1")
    assert proc.returncode == 1
    assert "Traceback (most recent call last)" in proc.stderr and "DataError" in proc.stderr


def test_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.setenv(SHOW_TRACEBACK, "0")
    with pytest.raises(KeyError), exit_on_user_error():
        raise KeyError("a bug")
    with pytest.raises(ValueError), exit_on_user_error():
        raise ValueError("a bug's ValueError is not a user's mistake")
    from omegaconf.errors import ConfigAttributeError

    with pytest.raises(ConfigAttributeError), exit_on_user_error():  # our code reading a key that is not there
        raise ConfigAttributeError("Missing key remine")


def test_a_mistake_exits_2_with_what_and_how(monkeypatch, capsys):
    monkeypatch.setenv(SHOW_TRACEBACK, "0")
    with pytest.raises(SystemExit) as stopped, exit_on_user_error():
        raise ConfigError("invalid config:\n  seed=-1: expected an integer >= 0\n  devices=0: expected auto")
    assert stopped.value.code == EXIT_USER_ERROR
    assert capsys.readouterr().err.splitlines() == [
        "error: invalid config: seed=-1: expected an integer >= 0; devices=0: expected auto",
        f"  fix: {ConfigError.hint} (HYDRA_FULL_ERROR=1 shows the traceback)"]


def test_a_mistake_raised_from_a_library_error_is_still_the_users():
    try:
        try:
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")
        except UnicodeDecodeError as cause:
            raise DataError("train.jsonl, line 7: not UTF-8") from cause
    except DataError as error:
        assert explain(error) == ("train.jsonl, line 7: not UTF-8", DataError.hint)
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = DataError("x.jsonl, line 1: empty query", hint="drop the row")
    assert explain(wrapped) == ("x.jsonl, line 1: empty query", "drop the row")
    handling = RuntimeError("a bug while handling a mistake")
    handling.__context__ = DataError("not the cause")  # implicit context: the bug is the news, not the mistake
    assert explain(handling) is None


def test_a_dataloader_workers_message_keeps_its_last_line():
    # torch re-raises a worker's exception with the worker's traceback inside the message
    error = DataError("Caught DataError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
                      '  File "x.py", line 1, in f\ngte_pro.errors.DataError: t.jsonl, line 3: empty positive')
    assert explain(error)[0] == "t.jsonl, line 3: empty positive"


def test_a_full_disk_is_the_users_to_fix():
    from gte_pro.utils.files import WriteError, write_error

    error = write_error("/runs/a/metrics.json", OSError(28, "No space left on device"))
    assert isinstance(error, OSError) and error.errno == 28
    assert explain(error) == ("could not write /runs/a/metrics.json: No space left on device (errno 28); "
                              f"{error.free}", WriteError.hint)
    assert error.free.endswith("free on /")  # /runs/a does not exist: the space of the nearest folder that does


def test_a_full_disk_in_a_writer_we_do_not_wrap_is_still_the_users_to_fix(tmp_path):
    """A logger's or a library's write: the OSError is the cause or the context of what reaches the top."""
    from gte_pro.errors import FULL_DISK_FIX

    full = OSError(28, "No space left on device")
    full.filename = str(tmp_path / "csv" / "metrics.csv")
    try:
        try:
            raise full
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 1 vs 2")  # noqa: B904
    except RuntimeError as wrapped:
        what, fix = explain(wrapped)
    assert what.startswith(f"could not write {full.filename}: No space left on device (errno 28); ")
    assert what.endswith(" free on /") and fix == FULL_DISK_FIX
    assert explain(OSError(2, "No such file or directory")) is None  # any other OS error stays a bug's traceback


def test_a_full_disk_at_a_writes_close_names_the_file_being_written(tmp_path):
    """A failed write() or close() raises an OSError without a path (Hydra's own .hydra/config.yaml on a full
    disk): the file open for writing where it was raised is the one named."""
    target = tmp_path / "config.yaml"
    try:
        with open(target, "w") as file:
            file.write("a: 1\n")
            raise OSError(28, "No space left on device")
    except OSError as error:
        what, _ = explain(error)
    assert what.startswith(f"could not write {target}: No space left on device (errno 28); ")
