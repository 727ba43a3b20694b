"""One run per folder (gte_pro.launch.run_lock) and stopping when asked (gte_pro.launch.stop): a second start of a
held folder is refused naming the holder, a dead holder's lock does not block, SIGTERM/SIGINT stop training at the
next step with a checkpoint (exit 143/130) and the run resumes to the same weights, score and mine stop at once
keeping their finished shards, and a sweep records the job as interrupted."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from gte_pro.errors import RunStopped
from gte_pro.launch import run_lock
from gte_pro.launch.run_lock import HOLDER_FILE, RunFolderBusy, acquire, release, run_folder_lock
from gte_pro.train import train
from tests.conftest import REPO
from tests.test_resume import RUN, assert_same_run


class NotStopped(AssertionError):
    """Raised by the test's own handler: the run did not handle the signal itself."""


@pytest.fixture
def signals_caught():
    """SIGTERM/SIGINT raise NotStopped unless the run replaces the handler: a run that leaves the signal to the
    default action would otherwise end the test process."""
    def caught(signum, frame):
        raise NotStopped(f"the run left {signal.Signals(signum).name} to the test's handler")

    previous = {s: signal.signal(s, caught) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


# --- one run per folder ----------------------------------------------------------------------------------------
def test_a_second_start_of_a_held_folder_is_refused_naming_the_holder(make_cfg, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    run = tmp_path / "run"
    fd = acquire(run)
    try:
        with pytest.raises(RunFolderBusy) as refused:
            acquire(run)
        message = str(refused.value)
        assert str(run) in message and socket.gethostname() in message and f"process {os.getpid()}" in message
        assert "SLURM job 4242" in message and re.search(r"started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", message)
        assert f"kill -TERM {os.getpid()}" in refused.value.hint and "hydra.run.dir=" in refused.value.hint
        monkeypatch.delenv("SLURM_JOB_ID")
        # the whole run is refused before it writes anything into the folder
        with pytest.raises(RunFolderBusy):
            train(make_cfg(["debug=fast", "logger=none"], output_dir=run))
        assert sorted(p.name for p in run.iterdir()) == [".run.lock", HOLDER_FILE]
    finally:
        release(fd)
    release(acquire(run))  # released: the next start takes it


def test_other_ranks_of_the_run_and_a_requeued_slurm_job_are_not_refused(tmp_path: Path, monkeypatch, caplog):
    run = tmp_path / "run"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    fd = acquire(run)
    try:
        monkeypatch.setenv("LOCAL_RANK", "1")  # a rank Lightning's DDP started: the launcher holds the folder
        assert not run_lock.takes_the_lock()
        with run_folder_lock(run):
            pass
        monkeypatch.delenv("LOCAL_RANK")
        with pytest.raises(RunFolderBusy, match="SLURM job 77"):  # a second job step of the same job and restart
            acquire(run)
        # the same SLURM job requeued (its restart count goes up) while a vanished node's lock is still held
        monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
        second = acquire(run)
        assert second is None and "same job requeued" in caplog.text
        monkeypatch.setenv("SLURM_JOB_ID", "78")
        with pytest.raises(RunFolderBusy, match="SLURM job 77"):
            acquire(run)
    finally:
        release(fd)


HOLD = """
import sys, time
from pathlib import Path
from gte_pro.launch.run_lock import acquire
acquire(Path(sys.argv[1]))
print("held", flush=True)
time.sleep(120)
"""


def test_the_lock_of_a_killed_holder_does_not_block(tmp_path: Path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(run)], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(RunFolderBusy, match=f"process {holder.pid},"):
            acquire(run)
    finally:
        holder.kill()  # kill -9: nothing of the holder cleans up
        holder.wait(timeout=30)
    assert json.loads((run / HOLDER_FILE).read_text())["pid"] == holder.pid  # its record is still there
    release(acquire(run))


# --- training stops at the next step with a checkpoint, and resumes -------------------------------------------
class SignalAt(Callback):
    """Sends ``signum`` to this process after optimizer step ``step``, as ``kill`` would."""

    def __init__(self, step: int, signum: str = "SIGTERM") -> None:
        self.step, self.signum = step, getattr(signal, signum)

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), self.signum)


def _signal_at(step: int, name: str) -> list[str]:
    return [*RUN, "+callbacks.signal._target_=tests.test_signals.SignalAt", f"+callbacks.signal.step={step}",
            f"+callbacks.signal.signum={name}"]


@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_a_signal_during_training_checkpoints_that_step_and_stops(make_cfg, tmp_path: Path, signals_caught, caplog,
                                                                  name: str):
    run = tmp_path / "stopped"
    with pytest.raises(RunStopped) as stopped:
        train(make_cfg([*_signal_at(3, name), "eval.before=false"], output_dir=run))
    assert stopped.value.exit_code == {"SIGTERM": 143, "SIGINT": 130}[name]
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 3  # every_n_steps=2 alone would have saved step 2
    lines = [r.getMessage() for r in caplog.records if "stopped by" in r.getMessage()]
    assert lines == [f"mode=train stopped by {name} (exit code {stopped.value.exit_code}); saved: {last} (step 3); "
                     f"resume with: python train.py hydra.run.dir={run}"]
    record = json.loads((run / "interrupted.json").read_text())
    assert record["signal"] == name and record["exit_code"] == stopped.value.exit_code
    assert signal.getsignal(signal.SIGTERM).__name__ == "caught"  # the job's handlers are gone after it


@pytest.mark.slow
def test_a_run_stopped_by_sigterm_resumes_to_bit_identical_weights(make_cfg, tmp_path: Path, signals_caught):
    """Uninterrupted vs SIGTERM after step 7 (checkpoint at 7, validation at 5 and 10) and started again."""
    reference = tmp_path / "reference"
    train(make_cfg(RUN, output_dir=reference))
    stopped = tmp_path / "stopped"
    with pytest.raises(RunStopped):
        train(make_cfg(_signal_at(7, "SIGTERM"), output_dir=stopped))
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 7
    train(make_cfg(RUN, output_dir=stopped))
    assert_same_run(stopped, reference)
    assert not (stopped / "interrupted.json").exists()


def test_sigterm_from_outside_stops_train_py_with_143_and_a_checkpoint(tmp_path: Path, cache_dir: Path):
    """A real ``kill -TERM`` of ``python train.py`` once a step has logged; while it runs, its folder is held."""
    run = tmp_path / "run"
    command = [sys.executable, "train.py", "debug=fast", "logger=none", "callbacks.progress_bar=null",
               "trainer.limit_train_batches=null", "data.max_train_rows=320", "trainer.max_epochs=3",
               "+callbacks.throughput.print_every_n_steps=1", "export.hf=false", "eval.before=false",
               f"paths.cache_dir={cache_dir}",
               f"hydra.run.dir={run}"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1", "GTE_PRO_CACHE": str(cache_dir)}
    proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    watchdog = threading.Timer(300, proc.kill)
    watchdog.start()
    output: list[str] = []
    try:
        for line in proc.stdout:
            output.append(line)
            if re.search(r"step [1-9]\d*/", line):
                break
        with pytest.raises(RunFolderBusy, match=f"process {proc.pid},"):
            acquire(run)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        output += proc.stdout.readlines()
        code = proc.wait()
        waited = time.monotonic() - sent
    finally:
        watchdog.cancel()
        proc.kill()
    text = "".join(output)
    assert code == 143, text[-3000:]
    assert waited < 60, waited
    step = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
    assert 1 <= step < 120 and not (run / "metrics.json").exists()
    assert re.search(rf"mode=train stopped by SIGTERM \(exit code 143\); saved: {re.escape(str(run))}/checkpoints/"
                     rf"last.ckpt \(step {step}\); resume with: python train.py .*hydra.run.dir={re.escape(str(run))}",
                     text), text[-3000:]


# --- score and mine stop at once ---------------------------------------------------------------------------------
from tests.test_score import cross_encoder  # noqa: E402, F401  (the tiny teacher fixture, one definition)


def test_sigterm_during_score_keeps_the_finished_shards(make_cfg, tmp_path: Path, cross_encoder: Path,  # noqa: F811 (the imported fixture)
                                                        signals_caught, monkeypatch):
    from gte_pro.scoring.shards import ShardFolder
    from tests.conftest import write_jsonl
    from tests.test_score import _overrides, _rows, _score

    train_file = write_jsonl(tmp_path / "train.jsonl", _rows())
    write = ShardFolder.write

    def signalled_after_one(self, index, *args):
        written = write(self, index, *args)
        os.kill(os.getpid(), signal.SIGTERM)
        return written

    monkeypatch.setattr(ShardFolder, "write", signalled_after_one)
    run = tmp_path / "stopped"
    with pytest.raises(RunStopped) as stopped:
        train(make_cfg(_overrides(cross_encoder, train_file), output_dir=run))
    assert stopped.value.exit_code == 143
    assert sorted(p.name for p in (run / "score_shards").iterdir()) == ["000000.json", "000000.jsonl"]
    assert "1 finished shard(s)" in json.loads((run / "interrupted.json").read_text())["saved"]
    monkeypatch.setattr(ShardFolder, "write", write)
    assert _score(make_cfg, _overrides(cross_encoder, train_file), run)["shards_reused"] == 1


def test_sigterm_during_mine_with_a_teacher_stops_it_and_the_rerun_only_rescores(make_cfg, tmp_path: Path,
                                                                                  signals_caught, monkeypatch):
    from gte_pro.modes import mine
    from tests.test_mine_rescore import _mine_overrides
    from tests.test_mining import tiny_teacher

    teacher = tmp_path / "teacher"
    tiny_teacher().model.save(teacher)
    rescore = mine.rescore_window

    def signalled(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        return rescore(*args, **kwargs)

    monkeypatch.setattr(mine, "rescore_window", signalled)
    run = tmp_path / "mine"
    overrides = _mine_overrides(tmp_path, teacher)  # writes the files: once, so that the reruns find them unchanged
    with pytest.raises(RunStopped) as stopped:
        train(make_cfg(overrides, output_dir=run))
    assert stopped.value.exit_code == 143 and not (run / "mined.jsonl").exists()
    assert "mined window" in json.loads((run / "interrupted.json").read_text())["saved"]
    assert (run / "mined_window.pt").is_file()

    # the same command again: the window is not mined again, the teacher rescores, the file is the uninterrupted one
    monkeypatch.setattr(mine, "rescore_window", rescore)
    mined_again = []
    mine_texts = mine.mine_texts
    monkeypatch.setattr(mine, "mine_texts", lambda *a, **k: mined_again.append(1) or mine_texts(*a, **k))
    train(make_cfg(overrides, output_dir=run))
    assert mined_again == [] and not (run / "mined_window.pt").exists()
    alone = tmp_path / "alone"
    train(make_cfg(overrides, output_dir=alone))
    assert mined_again == [1]
    assert (run / "mined.jsonl").read_bytes() == (alone / "mined.jsonl").read_bytes()


# --- the exports and mode=eval stop at once, leaving nothing partial ---------------------------------------------
def _signalled_before_replacing(monkeypatch, name: str) -> None:
    """SIGTERM this process when a finished ``name`` is about to be renamed into place (its write complete in the
    temporary sibling): the last moment at which a stop could leave half of it."""
    replace = os.replace

    def signalled(src, dst, *args, **kwargs):
        if Path(dst).name == name:
            os.kill(os.getpid(), signal.SIGTERM)
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", signalled)


@pytest.mark.slow
def test_sigterm_during_the_exports_stops_with_143_leaving_no_partial_export(make_cfg, tmp_path: Path,
                                                                             signals_caught, monkeypatch):
    run_overrides = [*RUN, "export.hf=true"]
    reference = tmp_path / "reference"
    train(make_cfg(run_overrides, output_dir=reference))
    stopped = tmp_path / "stopped"
    _signalled_before_replacing(monkeypatch, "hf")
    with pytest.raises(RunStopped) as raised:
        train(make_cfg(run_overrides, output_dir=stopped))
    assert raised.value.exit_code == 143
    assert (stopped / "model" / "model.safetensors").is_file()  # the export before it is complete
    assert not (stopped / "hf").exists() and not list(stopped.glob("hf.tmp*"))  # nothing partial, no temporary
    assert "last.ckpt" in json.loads((stopped / "interrupted.json").read_text())["saved"]
    from gte_pro.launch.sweep import summarize_sweep  # the record a sweep reads: interrupted, not finished

    (stopped / ".hydra").mkdir()
    (stopped / ".hydra" / "overrides.yaml").write_text("- seed=3\n")
    assert [row["status"] for row in summarize_sweep(tmp_path)] == ["interrupted"]
    monkeypatch.undo()
    train(make_cfg(run_overrides, output_dir=stopped))  # resumes from the checkpoint written at the end of training
    assert_same_run(stopped, reference)
    hf = [run / "hf" / "model.safetensors" for run in (stopped, reference)]
    assert hf[0].read_bytes() == hf[1].read_bytes() and not (stopped / "interrupted.json").exists()


def test_sigterm_during_mode_eval_stops_with_143_and_writes_no_metrics(make_cfg, tmp_path: Path, signals_caught,
                                                                      monkeypatch):
    overrides = ["mode=eval", "debug=fast", "logger=none"]
    run = tmp_path / "eval"
    _signalled_before_replacing(monkeypatch, "metrics.json")
    with pytest.raises(RunStopped) as raised:
        train(make_cfg(overrides, output_dir=run))
    assert raised.value.exit_code == 143
    assert not (run / "metrics.json").exists() and not list(run.glob("metrics.json.tmp*"))
    assert "nothing partial" in json.loads((run / "interrupted.json").read_text())["saved"]
    monkeypatch.undo()
    train(make_cfg(overrides, output_dir=run))
    alone = tmp_path / "alone"
    train(make_cfg(overrides, output_dir=alone))
    ours, theirs = (json.loads((folder / "metrics.json").read_text()) for folder in (run, alone))
    assert ours["val"] == theirs["val"] and not (run / "interrupted.json").exists()


# --- the exit code and the sweep's record --------------------------------------------------------------------------
@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_the_command_line_exits_with_128_plus_the_signal(signum: int, code: int):
    from gte_pro.errors import run_cli

    def stopped() -> None:
        raise RunStopped(signum)

    with pytest.raises(SystemExit) as exited:
        run_cli(stopped)
    assert exited.value.code == code


def test_a_sweep_summary_says_interrupted(tmp_path: Path):
    from gte_pro.launch.sweep import INTERRUPTED_FILE, summarize_sweep
    from gte_pro.utils.files import write_json_atomic

    for job, overrides in (("0", "model.lr=0.001"), ("1", "model.lr=0.002")):
        (tmp_path / job / ".hydra").mkdir(parents=True)
        (tmp_path / job / ".hydra" / "overrides.yaml").write_text(f"- {overrides}\n")
    write_json_atomic(tmp_path / "0" / "metrics.json", {"val": {"val/ndcg@10": 0.5}, "global_step": 4})
    write_json_atomic(tmp_path / "1" / INTERRUPTED_FILE, {"signal": "SIGTERM", "resume": "python train.py x"})
    rows = {row["job"]: row for row in summarize_sweep(tmp_path)}
    assert rows["0"]["status"] == "ok"
    assert rows["1"]["status"] == "interrupted"
    assert rows["1"]["error"] == "stopped by SIGTERM; resume: python train.py x"


def test_a_stopped_slurm_job_prints_a_resume_command_of_train_py(tmp_path: Path, monkeypatch):
    """Inside a submitit job argv[0] is submitit's own _submit.py: the printed command names train.py, the job's
    overrides and its folder (a storm on the local SLURM printed `python .../submitit/core/_submit.py ...`)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig

    from gte_pro.launch.stop import resume_command
    from tests.conftest import CONF

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["model.lr=0.002"], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    try:
        monkeypatch.setattr(sys, "argv", ["/venv/lib/python3.11/site-packages/submitit/core/_submit.py", "/f"])
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        assert resume_command(tmp_path) == f"python train.py model.lr=0.002 hydra.run.dir={tmp_path}"
        monkeypatch.delenv("SUBMITIT_EXECUTOR")
        monkeypatch.setattr(sys, "argv", ["my_train.py"])  # outside submitit: the script that was run
        assert resume_command(tmp_path) == f"python my_train.py model.lr=0.002 hydra.run.dir={tmp_path}"
    finally:
        HydraConfig.instance().cfg = None
        GlobalHydra.instance().clear()
