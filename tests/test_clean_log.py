"""The log of a default run holds what a user can act on, and ends with the metrics table and the model's path."""

from __future__ import annotations

import json
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
    lines = proc.stdout.strip().splitlines()
    start = max(i for i, line in enumerate(lines) if line.startswith("wall time: "))
    assert lines[start + 1].startswith("peak RSS at the end of: setup ")
    table, after = lines[start + 3 : start + 6], lines[start + 6 :]
    assert table[0].startswith("| set | ndcg@10 | ndcg@10 before") and table[2].startswith("| held-out |")
    assert after[-2] == f"metrics: {run_dir / 'metrics.json'}" and after[-1] == f"model:   {run_dir / 'model'}"
    # between them only the note of a run that ended below its val_before, which metrics.json records too
    notes = [line for line in after[:-2] if line]
    assert all(note.startswith("WARNING: val/ndcg@10 ") and "below" in note for note in notes), notes
    assert bool(notes) == bool(json.loads((run_dir / "metrics.json").read_text()).get("below_val_before"))
    # the export carries every weight of its architecture: transformers loads it without a load report
    assert (run_dir / "model" / "model.safetensors").is_file()
