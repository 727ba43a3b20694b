"""Multi-node DDP through the real engines on this one machine (slow suite):

- SLURM: ``python train.py -m hydra/launcher=slurm nodes=2 devices=1 ...`` on the two simulated nodes of
  ``GTE_SLURM_NODES=2 bash scripts/local_slurm.sh start`` (two slurmd, each in its own UTS namespace);
- torchrun: two agents (``--nnodes 2 --nproc-per-node 1``, c10d rendezvous), each in its own UTS namespace, as two
  nodes would start them.

Each job's first step, in float64 with dropout off, must give the loss and every parameter gradient of one process
on the concatenated batch (the ranks' batches are every other row of the same global batch, and the loss gathers
the other node's embeddings); the ranks report two hostnames and node ranks 0 and 1; rank 0 alone writes the one
run folder.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import REPO, free_port
from tests.slurm_helpers import slurm_env, two_nodes_up

# the first step in float64 without dropout, recorded by tests.probes.FirstStepProbe; 8 rows in the global batch
EXACT = ["debug=fast", "trainer.precision=64-true", "+model.random_init_config.hidden_dropout_prob=0.0",
         "+model.random_init_config.attention_probs_dropout_prob=0.0", "logger=none", "callbacks.progress_bar=null",
         "+callbacks.probe._target_=tests.probes.FirstStepProbe"]
GLOBAL_BATCH = 8


def _probe(folder: Path) -> list[dict]:
    return [torch.load(folder / f"rank{rank}.pt") for rank in range(len(list(folder.glob("rank*.pt"))))]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, cache_dir) -> dict:
    """The reference: one process, batch 8."""
    out = tmp_path_factory.mktemp("one_process")
    cmd = [sys.executable, "train.py", *EXACT, f"data.batch_size={GLOBAL_BATCH}", f"+callbacks.probe.out_dir={out}",
           f"hydra.run.dir={out / 'run'}", f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=slurm_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    (record,) = _probe(out)
    return record


def _assert_equals_one_process(ranks: list[dict], one: dict) -> None:
    assert [r["world_size"] for r in ranks] == [2, 2]
    assert sorted(r["node_rank"] for r in ranks) == [0, 1]
    assert len({r["hostname"] for r in ranks}) == 2, [r["hostname"] for r in ranks]
    # each rank's loss is the mean over its 4 queries against all 8 candidates: their mean is the global loss
    assert float(sum(r["loss"] for r in ranks) / 2) == pytest.approx(float(one["loss"]), rel=1e-5)
    assert set(ranks[0]["grads"]) == set(one["grads"])
    for rank in ranks:  # DDP averaged the gradients: every rank holds the full batch's
        for name, grad in one["grads"].items():
            torch.testing.assert_close(rank["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)


@pytest.mark.slow
@pytest.mark.skipif(not two_nodes_up(), reason="needs GTE_SLURM_NODES=2 bash scripts/local_slurm.sh start")
def test_a_two_node_slurm_job_trains_like_one_process_on_the_whole_batch(tmp_path: Path, cache_dir: Path,
                                                                        one_process: dict):
    sweep, probe = tmp_path / "sweep", tmp_path / "probe"
    cmd = [sys.executable, "train.py", "-m", "hydra/launcher=slurm", "strategy=ddp", "nodes=2", "devices=1", *EXACT,
           f"data.batch_size={GLOBAL_BATCH // 2}", f"+callbacks.probe.out_dir={probe}", f"hydra.sweep.dir={sweep}",
           f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env=slurm_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    ranks = _probe(probe)
    _assert_equals_one_process(ranks, one_process)
    assert {r["hostname"] for r in ranks} == {"gte-node1", "gte-node2"}
    # one job, one run folder, written by rank 0
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir() and not p.name.startswith(".")) == ["0"]
    assert json.loads((sweep / "0" / "metrics.json").read_text())["world_size"] == 2
    (submission,) = (sweep / ".submitit").rglob("*_submission.sh")
    assert "#SBATCH --nodes=2" in submission.read_text() and "#SBATCH --ntasks-per-node=1" in submission.read_text()


def _can_unshare_uts() -> bool:
    try:
        return subprocess.run(["unshare", "--uts", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


@pytest.mark.slow
@pytest.mark.skipif(not _can_unshare_uts(), reason="needs `unshare --uts` (root) to give each agent a hostname")
def test_two_torchrun_agents_train_one_job_like_one_process(tmp_path: Path, cache_dir: Path, one_process: dict):
    """Two agents as two nodes would start them: hostnames gte-tr1/gte-tr2, addresses 127.0.0.2/127.0.0.3, the
    rendezvous store on the first. No hydra.run.dir: both must find the one folder from --rdzv-id."""
    port, probe = free_port(), tmp_path / "probe"
    agents = []
    for node in (1, 2):
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "job42",
                    # the store lives with the first agent (both would match 127.0.0.1 here)
                    "--rdzv-conf", f"is_host={int(node == 1)}", "--local-addr", f"127.0.0.{node + 1}",
                    str(REPO / "train.py"), "strategy=ddp", "nodes=2", "devices=1", *EXACT,
                    f"data.batch_size={GLOBAL_BATCH // 2}", f"+callbacks.probe.out_dir={probe}",
                    f"paths.cache_dir={cache_dir}"]
        shell = f"hostname gte-tr{node} && exec \"$@\""
        env = {**slurm_env(), "PYTHONPATH": str(REPO), "GLOO_SOCKET_IFNAME": "lo"}
        agents.append(subprocess.Popen(["unshare", "--uts", "sh", "-c", shell, "sh", *torchrun], cwd=tmp_path,
                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outputs = [agent.communicate(timeout=600)[0] for agent in agents]
    finally:
        for agent in agents:
            agent.kill()
    for agent, output in zip(agents, outputs, strict=True):
        assert agent.returncode == 0, output[-3000:]
    ranks = _probe(probe)
    _assert_equals_one_process(ranks, one_process)
    assert {r["hostname"] for r in ranks} == {"gte-tr1", "gte-tr2"}
    # Lightning found torchrun's environment, and one folder holds the run: outputs/<task>/torchrun-<rdzv id>
    assert all("GLOBAL_RANK" in output for output in outputs)
    runs = list((tmp_path / "outputs").glob("*/*"))
    assert [p.name for p in runs] == ["torchrun-job42"], runs
    metrics = json.loads((runs[0] / "metrics.json").read_text())
    assert metrics["world_size"] == 2 and (runs[0] / "model" / "model.safetensors").is_file()


def test_torchrun_without_a_rendezvous_id_is_refused_with_the_fix(monkeypatch: pytest.MonkeyPatch):
    from gte_pro.launch.environment import run_stamp

    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ValueError, match="--rdzv-id"):
        run_stamp()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "nightly/7")
    assert run_stamp() == "torchrun-nightly_7"  # every process, every node: the same folder name
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")
    assert run_stamp()[:2] == "20"  # one process: its start time, as without torchrun
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert run_stamp()[:2] == "20"  # Lightning's own launcher passes hydra.run.dir to its children
