"""Nothing lost: exact mid-epoch resume, atomic checkpoints, damaged-checkpoint fallback, resume safety.

The kill -9 fault injection itself (subprocesses, many kills) is tests/test_fault_injection.py (slow).
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from lightning.pytorch import Callback

from gte_pro.data.collate import TokenCollator
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.sampling import EpochSampler, ResumableLoader
from gte_pro.launch.checkpoint_io import AtomicCheckpointIO, is_intact
from gte_pro.launch.resume import check_resumed_config, record_restart, restart_history, resume_checkpoint
from gte_pro.train import train
from gte_pro.utils.files import WriteError, remove_stale_temporaries


# --- the data order ------------------------------------------------------------------------------------------
def _sampler(world_size: int = 1, rank: int = 0, lengths: np.ndarray | None = None) -> EpochSampler:
    return EpochSampler(103, batch_size=4, world_size=world_size, rank=rank, seed=7, lengths=lengths,
                        window_batches=3)


def test_ranks_share_each_global_batch_and_a_resumed_pass_continues_it():
    lengths = np.arange(103) % 17
    one = list(_sampler(lengths=lengths))
    ranks = [list(_sampler(2, r, lengths)) for r in range(2)]
    assert len(ranks[0]) == len(ranks[1]) == 12 * 4  # 12 full global batches of 8; 7 rows left over
    whole = _sampler(2, 0, lengths).global_batches(0)
    for step in range(12):
        shares = [rows[step * 4 : (step + 1) * 4] for rows in ranks]
        assert sorted(r for share in shares for r, _ in share) == sorted(whole[step].tolist())
    assert len(one) == 25 * 4
    resumed = _sampler(2, 1, lengths)
    resumed.resume_at(0, 5)
    assert list(resumed) == ranks[1][5 * 4 :]
    assert list(resumed) == ranks[1]  # only the one resumed pass skips


def test_a_finished_epoch_resumes_at_the_next_epoch_start():
    sampler = _sampler()
    sampler.resume_at(3, sampler.batches_per_epoch)
    assert sampler.epoch == 4 and list(sampler)[0][1] == 4


def _rows(n: int = 64) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"query": [[i] for i in range(n)], "positives": [[[100 + i]] for i in range(n)],
                                       "negatives": [[[1000 + i], [2000 + i], [3000 + i]] for i in range(n)]})


def _loader(num_workers: int, tokenizer) -> ResumableLoader:
    pairs = TokenizedPairs(_rows(), num_negatives=2, seed=3)
    return ResumableLoader(pairs, _sampler_for(pairs), batch_size=4, drop_last=True, num_workers=num_workers,
                           collate_fn=TokenCollator(tokenizer))


def _sampler_for(pairs: TokenizedPairs) -> EpochSampler:
    return EpochSampler(len(pairs), batch_size=4, seed=11)


def _signature(batch: dict) -> tuple:
    return tuple(batch["rows"].tolist()), tuple(batch["doc"]["input_ids"].flatten().tolist())


@pytest.mark.parametrize("num_workers", [0, 2])
def test_loader_state_resumes_the_same_batches_and_draws(tokenizer, num_workers: int):
    """Stop after 5 batches of epoch 1, save the state, restore it into a new loader: the rest of the epoch (rows
    and the drawn negatives) equals an uninterrupted pass; and every epoch draws other negatives."""
    uninterrupted = _loader(num_workers, tokenizer)
    uninterrupted.sampler.set_epoch(1)
    expected = [_signature(b) for b in uninterrupted]
    first = _loader(num_workers, tokenizer)
    first.sampler.set_epoch(1)
    iterator = iter(first)
    head = [_signature(next(iterator)) for _ in range(5)]
    state = first.state_dict()
    assert state["epoch"] == 1 and state["batches_done"] == 5
    resumed = _loader(num_workers, tokenizer)
    resumed.load_state_dict(json.loads(json.dumps(state)))  # it travels in a checkpoint
    assert head + [_signature(b) for b in resumed] == expected
    resumed.sampler.set_epoch(2)
    assert [_signature(b) for b in resumed] != expected


def test_loader_refuses_a_state_from_another_batch_layout(tokenizer):
    state = _loader(0, tokenizer).state_dict()
    other = TokenizedPairs(_rows(), num_negatives=2, seed=3)
    loader = ResumableLoader(other, EpochSampler(len(other), batch_size=8, seed=11), batch_size=8, drop_last=True)
    with pytest.raises(ValueError, match="global_batch"):
        loader.load_state_dict(state)


# --- checkpoint files ----------------------------------------------------------------------------------------
def _save(folder: Path, value: float) -> None:
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.full((256,), value)}}, folder / "last.ckpt")


def test_checkpoint_writes_keep_the_previous_and_a_failed_write_changes_nothing(tmp_path: Path, monkeypatch):
    _save(tmp_path, 1.0)
    _save(tmp_path, 2.0)
    load = AtomicCheckpointIO().load_checkpoint
    assert load(tmp_path / "last.ckpt")["state_dict"]["w"][0] == 2.0
    assert load(tmp_path / "previous.ckpt")["state_dict"]["w"][0] == 1.0
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):
        f.write(b"PK half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(WriteError, match=r"could not write .*last\.ckpt: No space left on device \(errno 28\); "
                                         r".* free on /"):
        _save(tmp_path, 3.0)
    monkeypatch.setattr(torch, "save", real_save)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temp file, nothing rotated


class _FillsUp:
    """A file on a disk that fills after ``room`` bytes."""

    def __init__(self, path: Path, mode: str, room: int = 100) -> None:
        self.file, self.room = open(path, mode), room  # noqa: SIM115 - closed by __exit__

    def write(self, data: bytes) -> int:
        self.room -= len(data)
        if self.room < 0:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)

    def __enter__(self) -> _FillsUp:
        return self

    def __exit__(self, *args) -> None:
        self.file.close()


def test_a_full_disk_inside_torchs_zip_writer_is_a_write_error_naming_the_checkpoint(tmp_path: Path, monkeypatch):
    """torch's writer reports a failed write as RuntimeError("[enforce fail at inline_container.cc] unexpected
    pos ..."): the user sees the full disk and the path, and the previous checkpoint stays."""
    from gte_pro.launch import checkpoint_io

    _save(tmp_path, 1.0)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    monkeypatch.setattr(checkpoint_io, "open", _FillsUp, raising=False)
    with pytest.raises(WriteError, match=r"could not write .*last\.ckpt: No space left on device") as raised:
        _save(tmp_path, 2.0)
    assert isinstance(raised.value.__cause__.__cause__, RuntimeError)  # torch's own error, kept as the cause
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_damaged_last_checkpoint_falls_back_to_the_previous_one(tmp_path: Path, caplog):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    _save(folder, 1.0)
    _save(folder, 2.0)
    last = folder / "last.ckpt"
    last.write_bytes(last.read_bytes()[: last.stat().st_size // 2])  # truncated, as by a crash of the disk
    assert "unreadable" in is_intact(last)
    with caplog.at_level("ERROR"):
        found = resume_checkpoint(None, "auto", tmp_path)
    assert found == str(folder / "previous.ckpt")
    assert str(last) in caplog.text and "damaged" in caplog.text
    assert not last.exists() and len(list(folder.glob("last.ckpt.corrupt-*"))) == 1  # never rotated over a good one
    flipped = bytearray((folder / "previous.ckpt").read_bytes())
    flipped[len(flipped) // 2] ^= 0xFF  # one bit of rot inside the tensor data
    (folder / "previous.ckpt").write_bytes(bytes(flipped))
    with pytest.raises(ValueError, match="holds no intact checkpoint"):
        resume_checkpoint(None, "auto", tmp_path)
    with pytest.raises(ValueError, match=r"ckpt_path=.*damaged"):
        resume_checkpoint(str(next(folder.glob("last.ckpt.corrupt-*"))), "auto", tmp_path)
    assert resume_checkpoint(None, "never", tmp_path) is None


def test_temporaries_of_killed_writers_are_removed_and_live_ones_kept(tmp_path: Path):
    import os
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)  # a process that has exited: what a kill -9 leaves behind
    (tmp_path / f"last.ckpt.tmp{pid}").write_bytes(b"half a checkpoint")
    (tmp_path / f"hf.tmp{pid}").mkdir()
    (tmp_path / f"hf.tmp{pid}" / "model.safetensors").write_bytes(b"half a model")
    (tmp_path / f"model.tmp{pid}.old").mkdir()
    (tmp_path / f"metrics.json.tmp{os.getpid()}").write_text("{}")  # a live writer's: not ours to remove
    (tmp_path / "last.ckpt").write_bytes(b"kept")
    removed = remove_stale_temporaries(tmp_path)
    assert sorted(p.name for p in removed) == sorted([f"last.ckpt.tmp{pid}", f"hf.tmp{pid}", f"model.tmp{pid}.old"])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.ckpt", f"metrics.json.tmp{os.getpid()}"])


# --- resume safety ---------------------------------------------------------------------------------------------
def test_resuming_with_a_changed_training_key_is_an_error_unless_forced(make_cfg, tmp_path: Path):
    run = tmp_path / "run"
    check_resumed_config(make_cfg(["debug=fast"], output_dir=run), run, None)
    ckpt = str(run / "checkpoints" / "last.ckpt")
    # where and how a run reports may change
    assert check_resumed_config(make_cfg(["debug=fast", "data.num_workers=2", "logger=none"], output_dir=run),
                                run, ckpt) == {}
    changed = make_cfg(["debug=fast", "model.lr=5e-4", "data.batch_size=4"], output_dir=run)
    with pytest.raises(ValueError, match=r"(?s)data\.batch_size: 8 -> 4.*model\.lr: 0\.001 -> 0\.0005.*resume=force"):
        check_resumed_config(changed, run, ckpt)
    forced = make_cfg(["debug=fast", "model.lr=5e-4", "data.batch_size=4", "resume=force"], output_dir=run)
    assert check_resumed_config(forced, run, ckpt) == {"data.batch_size": [8, 4], "model.lr": [0.001, 0.0005],
                                                       "optimizer.lr": [0.001, 0.0005]}
    # a folder recorded by a version that counted trainer.memory_budget (now a check only) resumes without a change
    record = json.loads((run / "run_config.json").read_text())
    (run / "run_config.json").write_text(json.dumps({**record, "trainer.memory_budget": "auto"}))
    assert check_resumed_config(make_cfg(["debug=fast", "trainer.memory_budget=null"], output_dir=run), run,
                                ckpt) == {}


# --- end to end, in one process ----------------------------------------------------------------------------------
class Crash(Exception):
    """Stands in for a kill: the run stops between two checkpoints, nothing cleans up after it."""


class CrashAt(Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise Crash


class CrashAtTrainEnd(Callback):
    def on_train_end(self, trainer, *args) -> None:  # before LastCheckpoint's own save at the end
        raise Crash


RUN = ["debug=fast", "logger=none", "callbacks.progress_bar=null", "callbacks.last_checkpoint.every_n_steps=2",
       "trainer.limit_train_batches=null", "data.max_train_rows=96", "trainer.max_epochs=2",
       "trainer.val_check_interval=5", "export.hf=false"]


@pytest.mark.slow
def test_a_run_stopped_mid_epoch_resumes_to_bit_identical_weights(make_cfg, tmp_path: Path):
    """Uninterrupted vs stopped at step 7 (checkpoint at 6, validation at 5) and started again with the same
    config: the same weights, bit for bit, and the same metrics.json."""
    stop_at_step_7_and_resume(make_cfg, tmp_path, RUN)


def stop_at_step_7_and_resume(make_cfg, tmp_path: Path, run: list[str]) -> None:
    """``run`` uninterrupted, and stopped at step 7 (its last checkpoint at step 6) then started again with the same
    config: the same weights, bit for bit, and the same metrics.json."""
    reference = tmp_path / "reference"
    train(make_cfg(run, output_dir=reference))
    stopped = tmp_path / "stopped"
    with pytest.raises(Crash):
        train(make_cfg([*run, "+callbacks.crash._target_=tests.test_resume.CrashAt", "+callbacks.crash.step=7"],
                       output_dir=stopped))
    assert torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 6
    train(make_cfg(run, output_dir=stopped))
    assert_same_run(stopped, reference)
    restarts = json.loads((stopped / "metrics.json").read_text())["restarts"]
    assert [(r["restart"], r["step"], Path(r["resumed_from"]).name) for r in restarts] == [(1, 6, "last.ckpt")]


def assert_same_run(stopped: Path, reference: Path) -> None:
    def weights(run: Path) -> dict[str, torch.Tensor]:
        return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]

    ours, theirs = weights(stopped), weights(reference)
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    # the exported model is the best checkpoint's: the same bytes only if the resumed run chose the same one
    exported = [run / "model" / "model.safetensors" for run in (stopped, reference)]
    assert exported[0].read_bytes() == exported[1].read_bytes()
    a, b = (json.loads((run / "metrics.json").read_text()) for run in (stopped, reference))
    assert a["resumed_from"] and not b["resumed_from"]
    for key in ("val", "val_before", "global_step"):
        assert a[key] == b[key], key
    assert {k: v for k, v in a["train"].items() if "_per_s" not in k} == \
        {k: v for k, v in b["train"].items() if "_per_s" not in k}


@pytest.mark.slow
def test_a_run_killed_after_early_stopping_decided_stops_there_when_resumed(make_cfg, tmp_path: Path):
    """Lightning does not save trainer.should_stop: without our record, the resumed run would train on."""
    run = [*RUN, "callbacks.early_stopping.patience=0", "callbacks.early_stopping.min_delta=1.0"]
    reference = tmp_path / "reference"
    train(make_cfg(run, output_dir=reference))
    assert json.loads((reference / "metrics.json").read_text())["global_step"] == 10  # stopped at the 2nd validation
    stopped = tmp_path / "stopped"
    with pytest.raises(Crash):
        train(make_cfg([*run, "+callbacks.crash._target_=tests.test_resume.CrashAtTrainEnd"], output_dir=stopped))
    train(make_cfg(run, output_dir=stopped))
    assert_same_run(stopped, reference)


def test_time_based_last_checkpoint_agrees_on_the_clock_only_every_few_steps():
    """every_n_minutes needs the ranks to agree (one broadcast); asking at every step would sync DDP per step."""
    from types import SimpleNamespace

    from gte_pro.training.callbacks import TIME_CHECK_EVERY, LastCheckpoint

    asked = []
    strategy = SimpleNamespace(broadcast=lambda value: asked.append(value) or value)
    callback = LastCheckpoint("unused", every_n_steps=None, every_n_minutes=1e-9)
    due = [callback._due(SimpleNamespace(global_step=step, strategy=strategy)) for step in range(1, 31)]
    assert len(asked) == 30 // TIME_CHECK_EVERY
    assert [step for step, d in zip(range(1, 31), due, strict=True) if d] == [10, 20, 30]


def test_each_restart_is_logged_and_recorded_with_its_step_and_slurm_requeue(tmp_path: Path, monkeypatch, caplog):
    """What a preempted job's log and metrics.json say: how many times it came back, from which step, under which
    SLURM job and requeue count; a start from scratch clears the history; a line cut by a kill is skipped."""
    checkpoint = tmp_path / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    for restart_count, step in ((1, 12), (2, 30)):
        torch.save({"global_step": step, "epoch": 1}, checkpoint)
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart_count))
        with caplog.at_level("INFO", logger="gte_pro.launch.resume"):
            record_restart(tmp_path, str(checkpoint))
    assert f"resuming from {checkpoint} (step 30, epoch 1): restart 2 of this run folder; SLURM job 4242, " \
        "requeued 2 time(s)" in caplog.text
    with (tmp_path / "restarts.jsonl").open("a") as out:
        out.write('{"restart": 3, "st')  # a kill in the middle of the append
    history = restart_history(tmp_path)
    assert [(r["restart"], r["step"], r["slurm_job_id"], r["slurm_restart_count"]) for r in history] == \
        [(1, 12, "4242", 1), (2, 30, "4242", 2)]
    record_restart(tmp_path, str(checkpoint))  # the next restart's line is whole again
    assert [r["restart"] for r in restart_history(tmp_path)] == [1, 2, 3]
    record_restart(tmp_path, None)
    assert restart_history(tmp_path) == []


@pytest.mark.slow
def test_a_run_resumed_at_an_epoch_end_writes_checkpoints_that_resume_exactly(make_cfg, tmp_path: Path):
    """A checkpoint due at an epoch's last batch is saved one step later. Saved there (inside the epoch, before
    Lightning closes it), the run resumed from it trained on correctly, but Lightning never counted the next epoch as
    started, and the checkpoint *that* run wrote two steps later resumed into the wrong batch indices: the weights
    differed (found by SIGTERM at step 10 of a 10-batch epoch in scripts/fault_injection.py under DDP)."""
    run = [*RUN, "callbacks.last_checkpoint.every_n_steps=1"]
    reference = tmp_path / "reference"
    train(make_cfg(run, output_dir=reference))
    per_epoch = json.loads((reference / "metrics.json").read_text())["global_step"] // 2
    stopped = tmp_path / "stopped"
    for crash_at in (per_epoch + 1, per_epoch + 3):
        with pytest.raises(Crash):
            train(make_cfg([*run, "+callbacks.crash._target_=tests.test_resume.CrashAt",
                            f"+callbacks.crash.step={crash_at}"], output_dir=stopped))
        saved = torch.load(stopped / "checkpoints" / "last.ckpt", weights_only=True)["global_step"]
        assert saved != per_epoch and saved <= crash_at
    train(make_cfg(run, output_dir=stopped))
    assert_same_run(stopped, reference)
