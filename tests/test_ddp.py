"""A real 2-process DDP fit on the CPU (gloo), through the user's own command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_train_py_ddp_two_processes_bf16(tmp_path: Path, cache_dir: Path):
    """With LoRA adapters, a projection head and Matryoshka dims on: each option works under DDP too."""
    run_dir = tmp_path / "ddp_run"
    cmd = [sys.executable, "train.py", "debug=fast", "strategy=ddp", "devices=2", "precision=bf16-mixed",
           f"hydra.run.dir={run_dir}", f"paths.cache_dir={cache_dir}", "callbacks.progress_bar=null",
           "model.lora={r: 4, alpha: 8, dropout: 0.0}", "model.projection={dims: [48]}",
           "loss.matryoshka_dims=[48,16]"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-4000:]
    # two processes joined one gloo process group; rank 1 logged into its own file in the same folder
    assert "GLOBAL_RANK: 0, MEMBER: 1/2" in output and "GLOBAL_RANK: 1, MEMBER: 2/2" in output
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and metrics["global_step"] == 4
    assert (run_dir / "train_ddp_process_1.log").is_file()
    assert (run_dir / "model" / "model.safetensors").is_file() and (run_dir / "adapter").is_dir()
    assert "val/dim16/ndcg@10" in metrics["val"] and min(metrics["exports"]["min_cosine"].values()) >= 0.9999
    # rank 1 re-ran train.py into the same run folder: no second folder appeared
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ddp_run"]
