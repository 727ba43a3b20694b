"""A full disk during a training run (issue: the epoch-end best checkpoint on a 24 MB disk ended in torch's
RuntimeError traceback, exit 1, and the resumed run exported other weights): a two-line error naming the file and
the free space, exit code 2, and the same command, once there is room, ends bit-identical to an uninterrupted run.

scripts/disk_full.py runs every write kind (``make reliability``'s disk-full cases); these are its two sharpest
cases: ENOSPC injected at the best checkpoint's write (no root needed), and a real tmpfs that fills inside it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

sys.path.insert(0, str(REPO / "scripts"))

import disk_full  # noqa: E402


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple[Path, dict[str, int]]:
    return disk_full.reference_run(tmp_path_factory.mktemp("disk_full"))


def _assert_named_and_exact(result: dict) -> None:
    assert result["exit"] == 2 and not result["traceback"], result
    assert "checkpoints/epoch00-step000004.ckpt: No space left on device (errno 28); " in result["error"], result
    assert result["rerun_exit"] == 0 and result["weights"] and result["exported"] and result["metrics"], result


@pytest.mark.slow
def test_a_full_disk_at_the_best_checkpoint_write_is_named_and_the_rerun_is_exact(reference, tmp_path: Path):
    [result] = disk_full.inject(tmp_path, ["checkpoint-best"], quick=True, reference=reference)
    _assert_named_and_exact(result)
    assert " free on /" in result["error"]


@pytest.mark.slow
def test_a_real_disk_that_fills_inside_the_best_checkpoint_is_named_and_the_rerun_is_exact(reference,
                                                                                          tmp_path: Path):
    """The issue's case: room for the start, the caches and the first validation, not for the 24 MB checkpoint."""
    if not disk_full.can_mount():  # probed here, not at collection: the probe mounts a tmpfs
        pytest.skip("mounting a tmpfs needs root and a machine that allows it")
    size = disk_full.footprint(reference[0])
    with disk_full.small_disk(tmp_path / "small", size * 2) as mount:
        [result] = disk_full.fill_levels(mount, reference[0], [8 << 20])
    _assert_named_and_exact(result)
    assert f"free on {tmp_path / 'small'}" in result["error"]
