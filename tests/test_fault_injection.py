"""kill -9 at random moments (and inside checkpoint writes and exports), then the same command again: the run ends
with weights bit-identical to an uninterrupted run. A smaller version of `make reliability` (README, Reliability)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_killed_runs_resume_to_bit_identical_weights(tmp_path: Path):
    report = tmp_path / "faults.json"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "fault_injection.py"), "--variants", "base,ddp",
                           "--kills", "3", "--kills-per-run", "3", "--seed", "1", "--work", str(tmp_path / "work"),
                           "--json", str(report)], cwd=REPO, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads(report.read_text())
    assert [r["variant"] for r in results] == ["base", "ddp"]
    for result in results:
        assert result["kills"] == 3 and result["runs"] >= 1
        assert result["identical"] == result["same_metrics"] == result["runs"], result
