"""A user's mistakes, and how the command line reports them: one line saying what and where, one saying how to fix
it, exit code 2, no traceback. A bug is anything else: it keeps its traceback.

The package raises the types below for what a user can fix (a config value, a data row, a missing file, a refused
resume, a full disk); Hydra's own composition errors (an unknown group option, key or override syntax) count too.
``HYDRA_FULL_ERROR=1`` shows the traceback of a user's mistake as well.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator
from typing import Any

EXIT_USER_ERROR = 2
# set by the first process from the user's HYDRA_FULL_ERROR and inherited by the ranks it starts, which then see
# HYDRA_FULL_ERROR=1 (set below so that Hydra hands every error to ``run_cli``) without taking it for the user's wish
SHOW_TRACEBACK = "GTE_PRO_SHOW_TRACEBACK"
CHECK_PATH = "check the path (a relative path is read from the folder you started the command in)"
# the fix line for a key Hydra refused to override, (key, value) -> fix: gte_pro.config.known_keys sets it to one
# that names the nearest valid key (this module is the package's floor and imports none of it)
unknown_key_fix: Callable[[str, str], str] | None = None


class UserError(Exception):
    """Something the user can fix; the message names it and where it is, ``hint`` says how to fix it."""

    hint = "correct it and run the same command again"

    def __init__(self, *args: Any, hint: str | None = None) -> None:
        super().__init__(*args)
        if hint is not None:
            self.hint = hint


class ConfigError(UserError, ValueError):
    """A composed config with a wrong value or key; the message names each key and what is valid."""

    hint = "fix the key on the command line or in conf/ (`python train.py --cfg job` prints the composed config)"


class DataError(UserError, ValueError):
    """Bad training or evaluation data; the message names the file, line and field."""

    hint = "fix that line of the file, or drop it, and run the same command again"


class MissingFileError(UserError, FileNotFoundError):
    """A file or folder the config names does not exist."""

    hint = CHECK_PATH


class MissingModelError(MissingFileError):
    """``model.name_or_path`` is neither a model folder nor a hub model this machine can reach."""

    hint = ("give a folder that holds a Hugging Face model, or a hub name with network access or in the local cache "
            "(HF_HUB_OFFLINE=1 reads the cache only)")


class ModelMismatchError(UserError, ValueError):
    """Models that cannot be merged (``mode=merge``): different architectures, shapes or tensors; the message names
    the two folders and the first difference."""

    hint = ("merge only fine-tunes of one base model (the same config.json shape keys, pooling and tensors); drop "
            "the member the message names from merge.models")


class ResumeError(UserError, ValueError):
    """A resume that would mix two different runs or has no intact checkpoint to start from."""

    hint = "resume=never starts the run afresh in a new folder; resume=force continues with this config"


class MissingDependencyError(UserError, ImportError):
    """An option that needs a package this environment lacks; the message names the option and the package."""

    hint = "install the extra the message names, or turn the option off"


FULL_DISK = (errno.ENOSPC, errno.EDQUOT)  # no space left, or the user's quota spent
FULL_DISK_FIX = ("free space there (or point paths.output_dir / paths.cache_dir at a larger disk), then run the same "
                 "command again: a run resumes from its last complete checkpoint, nothing complete was lost")


def free_space(path: str | os.PathLike | None) -> str:
    """How much space is free where ``path`` is (or would be), as a user reads it: "1.2 MB free on /scratch"."""
    from pathlib import Path

    folder = Path(path or ".").absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return "free space unknown"
    units = [(2**30, "GB"), (2**20, "MB"), (2**10, "KB")]
    size = next((f"{free / scale:.1f} {unit}" for scale, unit in units if free >= scale), f"{free} bytes")
    while not os.path.ismount(folder) and folder != folder.parent:
        folder = folder.parent
    return f"{size} free on {folder}"


def _full_disk(error: BaseException) -> OSError | None:
    """The full disk behind ``error`` (itself, what it was raised from, or what it was raised while handling), for a
    writer we do not wrap ourselves (a logger, a library's save): the disk is the user's to fix wherever it fills."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in FULL_DISK:
            return error
        error = error.__cause__ or error.__context__
    return None


def _file_being_written(error: BaseException) -> str | None:
    """The path of the file open for writing nearest to where ``error`` was raised: a failed ``write()`` or
    ``close()`` raises an OSError without one (Hydra's ``.hydra/config.yaml``, a logger's CSV)."""
    import io

    frames = []
    trace = error.__traceback__
    while trace is not None:
        frames.append(trace.tb_frame)
        trace = trace.tb_next
    for frame in reversed(frames):
        for value in frame.f_locals.values():
            name, mode = getattr(value, "name", None), getattr(value, "mode", "")
            if isinstance(value, io.IOBase) and isinstance(name, str) and any(c in str(mode) for c in "wax+"):
                return name
    return None


class RunStopped(BaseException):
    """A run stopped on SIGTERM or SIGINT (``gte_pro.launch.stop``) after saving what it could; ``saved`` says what
    (a checkpoint, finished shards), or is empty. A BaseException, so that no ``except Exception`` swallows it;
    ``run_cli`` exits with 128 + the signal's number, as a shell reports a process killed by that signal."""

    def __init__(self, signum: int, saved: str = "") -> None:
        import signal

        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum
        self.saved = saved

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def _hydra_user_errors() -> tuple[type[BaseException], ...]:
    """Hydra's composition errors, and OmegaConf's about a value the user wrote (a wrong type, an unset ``???``, an
    interpolation that cannot be resolved); not a missing attribute, which is as likely our bug as the user's."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import GrammarParseError, InterpolationResolutionError, MissingMandatoryValue, ValidationError

    return (ConfigCompositionException, MissingConfigException, OverrideParseException, ValidationError,
            MissingMandatoryValue, InterpolationResolutionError, GrammarParseError)


def _causes(error: BaseException | None) -> Iterator[BaseException]:
    """``error`` and what it was explicitly raised from (``raise X from Y``), not what it was handling; except that
    what a config resolver raised (``${cached_model:...}``) is the cause of OmegaConf's InterpolationResolutionError,
    which OmegaConf raises while handling it, without ``from``."""
    from omegaconf.errors import InterpolationResolutionError

    while error is not None:
        yield error
        implicit = error.__context__ if isinstance(error, InterpolationResolutionError) else None
        error = error.__cause__ or implicit


def user_error(error: BaseException) -> BaseException | None:
    """The user's mistake behind ``error`` (``error`` itself or an explicit cause; our own type before Hydra's,
    whose hints are generic), or None for a bug."""
    causes = list(_causes(error))
    hydra_kinds = _hydra_user_errors()
    return (next((e for e in causes if isinstance(e, UserError)), None)
            or next((e for e in causes if isinstance(e, hydra_kinds)), None))


def _one_line(text: str) -> str:
    # a DataLoader worker re-raises with the worker's traceback in the message: its last line is the message
    if "Traceback (most recent call last)" in text:
        text = re.sub(r"^\w+(\.\w+)*: ", "", text.strip().splitlines()[-1])
    return re.sub(r"\s*\n\s*", "; ", text.strip()).replace(":; ", ": ")


def _hydra_hint(error: BaseException, message: str) -> str:
    from hydra.errors import MissingConfigException

    if isinstance(error, MissingConfigException) and getattr(error, "options", None):
        return "choose one of: " + ", ".join(error.options)
    if match := re.search(r"To append to your config use \+(\S+?)=(\S*)", message):
        if unknown_key_fix is not None:
            return unknown_key_fix(match[1], match[2])
        return (f"check the key's spelling (`python train.py --cfg job` lists the keys) or add it: "
                f"+{match[1]}={match[2]}")
    return "check the override's syntax: key=value, group=option, +new_key=value (see docs/configuration.md)"


def explain(error: BaseException) -> tuple[str, str] | None:
    """(what and where, how to fix it) of a user's mistake, each one line; None for a bug."""
    mistake = user_error(error)
    if mistake is None:
        full = _full_disk(error)
        if full is None:
            return None
        path = full.filename or _file_being_written(full)
        where = f"could not write {path}" if path else "a write failed"
        return f"{where}: {full.strerror} (errno {full.errno}); {free_space(path)}", FULL_DISK_FIX
    if isinstance(mistake, UserError):
        return _one_line(str(mistake)), mistake.hint
    # Hydra's lists of options and its config search path belong to the fix line, not the message
    message = re.split(r"\n\s*(Available options|Config search path|To append to your config)", str(mistake))[0]
    cause = mistake.__cause__
    if cause is not None and str(cause) and str(cause) not in message:
        message = f"{message.rstrip('.')}: {str(cause).splitlines()[0]}"
    return _one_line(message), _hydra_hint(mistake, str(mistake))


def _show_traceback() -> bool:
    return os.environ.get(SHOW_TRACEBACK, os.environ.get("HYDRA_FULL_ERROR", "0")) == "1"


@contextlib.contextmanager
def exit_on_user_error() -> Iterator[None]:
    """A user's mistake inside the block prints two lines to stderr and exits 2; a bug propagates."""
    try:
        yield
    except Exception as error:
        lines = None if _show_traceback() else explain(error)
        if lines is None:
            raise
        sys.stderr.write(f"error: {lines[0]}\n  fix: {lines[1]} (HYDRA_FULL_ERROR=1 shows the traceback)\n")
        raise SystemExit(EXIT_USER_ERROR) from None


def run_cli(main: Callable[[], Any]) -> None:
    """Run a ``@hydra.main`` function as the command line. Its body reports its own mistakes (``exit_on_user_error``
    around the job, so that Hydra adds no line of its own); this catches those Hydra finds before the job starts: an
    unknown group option or key, an override's syntax. A run stopped by SIGTERM or SIGINT exits 143 or 130."""
    os.environ.setdefault(SHOW_TRACEBACK, "1" if os.environ.get("HYDRA_FULL_ERROR") == "1" else "0")
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra raises instead of printing its own partial traceback
    with exit_on_user_error():
        try:
            main()
        except RunStopped as stopped:  # SIGTERM/SIGINT: the run saved what it could and said so (gte_pro.train)
            raise SystemExit(stopped.exit_code) from None
