"""`python train.py` as a user runs it: packaged MiniLM on the demo corpus, then evaluation and export."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


@pytest.mark.slow
def test_default_run_improves_ndcg_and_exports(tmp_path: Path, cache_dir: Path):
    run_dir = tmp_path / "default"
    cmd = [sys.executable, "train.py", f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    before, after = metrics["val_before"]["val/ndcg@10"], metrics["val"]["val/ndcg@10"]
    print(f"default run: val/ndcg@10 {before:.4f} -> {after:.4f}")
    assert after > before
    assert (run_dir / "model" / "modules.json").is_file()
