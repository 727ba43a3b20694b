"""Checkpoint files that survive a kill at any moment.

Lightning writes a checkpoint straight onto its final path, so a kill (or a full disk) during the write leaves a
truncated ``last.ckpt`` and nothing to resume from. ``AtomicCheckpointIO`` writes to a temporary sibling, flushes
it to disk, keeps the previous ``last.ckpt`` as ``previous.ckpt`` and only then renames the new file into place:
at every instant the folder holds at least one complete checkpoint. ``is_intact`` checks a file before a run
resumes from it (``gte_pro.launch.resume``).
"""

from __future__ import annotations

import logging
import os
import zipfile
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.cloud_io import _is_local_file_protocol

from gte_pro.utils.files import fsync_folder, temporary_sibling, write_error

log = logging.getLogger(__name__)

LAST = "last.ckpt"
PREVIOUS = "previous.ckpt"  # the last.ckpt before the newest one, kept for when the newest is unreadable


def is_intact(path: str | Path) -> str | None:
    """None if ``path`` is a complete torch checkpoint, else why not. Reads the file once and checks the CRC of
    every entry of its zip archive (no unpickling: cheap next to loading, and it catches truncation and bit rot)."""
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                return "not a torch checkpoint (no data.pkl in the archive)"
            bad = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError) as error:
        return f"unreadable ({type(error).__name__}: {error})"
    return f"entry {bad} fails its CRC check" if bad else None


def _on_cpu(storage: Any, location: Any) -> Any:
    return storage  # Lightning's default: every tensor stays on the CPU; the strategy moves what it needs


class _RecordedWrites:
    """A file whose first OS error is kept: torch's zip writer turns a failed ``write()`` into a ``RuntimeError``
    ("[enforce fail at inline_container.cc] unexpected pos ..."), which loses the cause (a full disk)."""

    def __init__(self, file: Any) -> None:
        self.file = file
        self.name = file.name  # what a file object answers; fault harnesses pick checkpoint writes by it
        self.error: OSError | None = None

    def write(self, data: Any) -> int:
        try:
            return self.file.write(data)
        except OSError as error:
            self.error = self.error or error
            raise

    def flush(self) -> None:
        self.file.flush()


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's torch checkpoint IO, written atomically (local paths) and read with ``weights_only=True``."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if not _is_local_file_protocol(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_sibling(path)
        try:
            with open(tmp, "wb") as file:
                recorded = _RecordedWrites(file)
                try:
                    torch.save(checkpoint, recorded)
                except RuntimeError as error:
                    if recorded.error is None:
                        raise
                    raise recorded.error from error
                file.flush()
                os.fsync(file.fileno())
            if path.name == LAST and path.is_file():
                os.replace(path, path.with_name(PREVIOUS))
            os.replace(tmp, path)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            raise write_error(path, error) from error
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        fsync_folder(path.parent)  # the renames themselves reach the disk

    def load_checkpoint(self, path: Any, map_location: Any = _on_cpu, weights_only: bool | None = None) -> Any:
        # our checkpoints hold tensors, numbers, strings and plain containers only: no pickled code runs on load
        return super().load_checkpoint(path, map_location=map_location,
                                       weights_only=True if weights_only is None else weights_only)
