"""What the SLURM tests share: whether the local cluster of scripts/local_slurm.sh answers, and with which nodes."""

from __future__ import annotations

import os
import shutil
import subprocess

# the simulated nodes of `GTE_SLURM_NODES=2 bash scripts/local_slurm.sh start`
TWO_NODES = ("gte-node1", "gte-node2")


def node_states() -> dict[str, str]:
    """Node name -> state, for every node the controller knows ({} when there is no cluster)."""
    if not shutil.which("sinfo"):
        return {}
    probe = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return {}
    return dict(line.split()[:2] for line in probe.stdout.splitlines() if len(line.split()) >= 2)


def takes_work(state: str) -> bool:
    return any(state.startswith(s) for s in ("idle", "mix", "alloc"))


def slurm_up() -> bool:
    return any(takes_work(state) for state in node_states().values())


def two_nodes_up() -> bool:
    states = node_states()
    return all(takes_work(states.get(node, "")) for node in TWO_NODES)


def slurm_env() -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1"}
