"""The log of a default run holds what a user can act on, and ends with the metrics table and the model's path."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO

# what a run must not print: Lightning's adverts, banners and summary, dependency deprecations, transformers' load
# report of a half-saved model, sentence-transformers' progress bars, the srun hint, wandb when it is not the logger
NOISE = {
    "Lightning tip": r"Tip:",
    "hardware banner": r"GPU available:|TPU available:",
    "model summary": r"Total FLOPs|Trainable params",
    "LeafSpec deprecation": r"LeafSpec",
    "deprecation": r"(?i)deprecat",
    "load report": r"LOAD REPORT|MISSING",
    "srun hint": r"srun",
    "wandb": r"(?i)wandb",
    "weights_only note": r"weights_only",
    "progress bars of the export checks": r"Batches:|Loading weights|Writing model shards",
    "seed banner": r"Seed set to",
    "python warning": r"Warning:",
}


def test_a_default_debug_run_prints_no_noise_and_ends_with_the_table_and_the_model(tmp_path: Path, cache_dir: Path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, "train.py", "debug=fast", f"hydra.run.dir={run_dir}",
                           f"paths.cache_dir={cache_dir}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=900)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-4000:]
    found = {name: re.search(pattern, log).group(0) for name, pattern in NOISE.items() if re.search(pattern, log)}
    assert not found, f"noise in the log: {found}\n{log[-6000:]}"
    # the breakdown of time and memory, then the table
    assert proc.stdout.strip().splitlines()[-9].startswith("wall time: ")
    assert proc.stdout.strip().splitlines()[-8].startswith("peak RSS at the end of: setup ")
    last = proc.stdout.strip().splitlines()[-6:]
    assert last[0].startswith("| set | ndcg@10 | ndcg@10 before") and last[2].startswith("| held-out |")
    assert last[-2] == f"metrics: {run_dir / 'metrics.json'}" and last[-1] == f"model:   {run_dir / 'model'}"
    # the export carries every weight of its architecture: transformers loads it without a load report
    assert (run_dir / "model" / "model.safetensors").is_file()
