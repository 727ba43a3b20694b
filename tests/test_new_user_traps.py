"""Traps a new user still met (issue 42, item 5): each refused before any model loads, with the two-line error.

- a misspelled key: the fix names the nearest valid key (``+lr=1e-4``: ``model.lr``; ``+trainer.max_epoch=2``:
  ``trainer.max_epochs``), not ``+key=value``; a key added with ``+`` that nothing reads is refused;
- ``-m hydra/launcher=slurm`` on a machine without SLURM: two lines naming ``sbatch``, not a 40-line traceback;
- ``loss=distill_kl`` on a scored file without negatives: refused by the config check (before: once the model had
  loaded), and the fix says to mine negatives first (scoring adds none);
- ``mode=mine`` that keeps no negative: an error, not a file of empty rows and exit 0; its report's dropped share is
  of the candidates the window held, its ``model`` names the model that mined, its next command keeps ``model=`` and
  ``debug=``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gte_pro.config.checks import check_config
from gte_pro.config.known_keys import nearest_key
from gte_pro.errors import ConfigError, UserError, explain
from tests.test_errors import _error_lines, _train


# --- misspelled keys ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("override,meant", [
    ("+lr=1e-4", "did you mean model.lr=0.0001?"),  # before: composed, trained, and nothing read it
    ("+trainer.max_epoch=2", "did you mean trainer.max_epochs=2?"),  # before: a TypeError once the model loaded
    ("+seeed=3", "did you mean seed=3?"),
])
def test_a_key_added_with_plus_that_nothing_reads_is_refused_with_the_nearest_key(make_cfg, override, meant):
    with pytest.raises(ConfigError) as error:
        check_config(make_cfg(["debug=fast", override]))
    what, fix = explain(error.value)
    assert override[1:].split("=")[0] in what and fix.startswith(meant), (what, fix)
    assert "+" not in fix


@pytest.mark.parametrize("overrides", [
    ["+trainer.enable_checkpointing=false", "+trainer.limit_val_batches=0"],  # any Lightning Trainer argument
    ["+callbacks.crash._target_=tests.probes.CrashAt", "+callbacks.crash.step=1"],  # a callback of one's own
    ["+model.random_init_config.hidden_dropout_prob=0.0"],  # inside a dict-valued setting
    ["+wandb_key=${oc.env:HOME}"],  # a user's variable for other keys to read
])
def test_the_keys_users_add_with_plus_still_pass(make_cfg, overrides):
    check_config(make_cfg(["debug=fast", *overrides]))


@pytest.mark.parametrize("wrong,value,near", [
    ("modle", "tiny", "model"), ("lr", None, "model.lr"), ("data.lr", None, "model.lr"),
    ("data.batchsize", None, "data.batch_size"), ("loss.temprature", None, "loss.temperature"),
    ("mine.relative_margn", None, "mine.relative_margin"), ("trainer.max_epoch", None, "trainer.max_epochs"),
    ("foo", None, None),
])
def test_the_nearest_key(wrong, value, near):
    assert nearest_key(wrong, value) == near


def test_a_key_hydra_refuses_is_answered_with_the_key_meant_not_with_plus():
    from hydra import compose, initialize_config_dir

    from tests.conftest import CONF

    for override, fix in [("lr=1e-4", "did you mean model.lr=1e-4?"),
                          ("trainer.enable_checkpointing=false", "add it with +: +trainer.enable_checkpointing=false")]:
        with pytest.raises(Exception) as error, initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            compose("train", overrides=[override])
        assert explain(error.value)[1].startswith(fix), explain(error.value)


def test_the_command_line_refuses_a_misspelled_trainer_key_before_the_model_loads(tmp_path: Path):
    proc = _train(["debug=fast", "+trainer.max_epoch=2"], tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    what, fix = _error_lines(proc)
    assert what == ("error: invalid config: trainer.max_epoch: neither a Lightning Trainer argument nor a key of "
                    "conf/trainer")
    assert fix.startswith("  fix: did you mean trainer.max_epochs=2?")
    assert "encoder" not in proc.stdout + proc.stderr  # no model was loaded


# --- hydra/launcher=slurm without SLURM ----------------------------------------------------------------------------
def test_slurm_commands_are_looked_up_on_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from hydra_plugins.gte_pro_launcher.launchers import check_slurm_installed, slurm_missing

    monkeypatch.setenv("PATH", str(tmp_path))  # whatever this machine has installed (scripts/local_slurm.sh)
    assert slurm_missing() == ["sbatch", "srun"]
    with pytest.raises(UserError) as error:
        check_slurm_installed()
    what, fix = explain(error.value)
    assert what.startswith("hydra/launcher=slurm: SLURM is not installed on this machine (`sbatch` and `srun` not "
                           "on PATH)")
    assert "SLURM login node" in fix and "drop hydra/launcher=slurm" in fix
    for name in ("sbatch", "srun"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    assert slurm_missing() == []


def test_a_slurm_sweep_without_slurm_ends_in_two_lines(tmp_path: Path):
    empty = tmp_path / "bin"
    empty.mkdir()
    proc = _train(["-m", "hydra/launcher=slurm", "debug=fast", f"hydra.sweep.dir={tmp_path / 'sweep'}"], tmp_path,
                  PATH=str(empty))
    assert proc.returncode == 2, proc.stderr[-3000:]  # before: rc 1 and submitit's RuntimeError about srun
    assert "Traceback" not in proc.stderr
    what, fix = _error_lines(proc)
    assert what.startswith("error: hydra/launcher=slurm: SLURM is not installed on this machine (`sbatch` and "
                           "`srun` not on PATH)")
    assert "drop hydra/launcher=slurm" in fix


# --- distillation from scored rows without negatives -------------------------------------------------------------
def _scored_without_negatives(path: Path, scored: bool = True) -> Path:
    from tests.conftest import write_jsonl

    return write_jsonl(path, [{"query": f"what is topic number {i}?", "pos": [f"Topic {i} covers item {i}."],
                               **({"pos_scores": [0.9]} if scored else {})} for i in range(40)])


def test_distilling_scored_rows_without_negatives_is_refused_before_the_model_loads(make_cfg, tmp_path: Path):
    path = _scored_without_negatives(tmp_path / "scored.jsonl")
    with pytest.raises(ConfigError) as error:  # before: passed, and the data module refused it after the model loaded
        check_config(make_cfg(["debug=fast", "loss=distill_kl", "data=jsonl", f"data.train_file={path}"]))
    what, fix = explain(error.value)
    assert what == (f"invalid config: data.train_file={path}: loss=distill_kl distils the teacher's scores of each "
                    "row's hard negatives, and no row of the file has any (scoring adds no negatives: mining does)")
    assert fix.startswith(f"mine hard negatives first (python train.py mode=mine data=jsonl data.train_file={path})"
                          ", score the mined file (python train.py mode=score")
    assert "score the file first" not in fix  # before: the fix said to score it, which adds no negatives


def test_an_unscored_file_without_negatives_is_told_to_mine_first(make_cfg, tmp_path: Path):
    from gte_pro.config.checks import config_problems

    path = _scored_without_negatives(tmp_path / "pairs.jsonl", scored=False)
    problems = config_problems(make_cfg(["loss=margin_mse", "data=jsonl", f"data.train_file={path}"]))
    assert any(p.startswith(f"data.train_file={path}: loss=margin_mse needs teacher scores") and
               "mine hard negatives first" in p for p in problems), problems


def test_the_data_modules_fix_says_to_mine_when_the_rows_have_scores_but_no_negatives():
    from gte_pro.data.row_checks import distill_problem

    what, fix = distill_problem("distill_kl", "f.jsonl", scored=True, negatives=0)
    assert what == ("f.jsonl: loss=distill_kl needs hard negatives in the training rows, and they have none "
                    "(scoring adds no negatives: mining does)")
    assert fix.startswith("mine hard negatives first (python train.py mode=mine data=jsonl data.train_file=f.jsonl)")
    what, fix = distill_problem("distill_kl", "f.jsonl", scored=False, negatives=3)
    assert "teacher scores" in what and fix.startswith("score the file first")
    assert distill_problem("distill_kl", "f.jsonl", scored=True, negatives=3) is None


# --- mode=mine -----------------------------------------------------------------------------------------------------
MINE = ["mode=mine", "debug=fast", "logger=none"]


def test_mining_that_keeps_no_negative_is_an_error(make_cfg, tmp_path: Path):
    from gte_pro.train import train

    run = tmp_path / "mine"
    with pytest.raises(ConfigError) as error:  # before: exit 0, no warning, and 64 rows with "negatives": []
        train(make_cfg([*MINE, "mine.relative_margin=null", "mine.absolute_margin=2"], output_dir=run))
    what, fix = explain(error.value)
    assert what.startswith("mode=mine kept no negative for any of the 64 rows: mine.absolute_margin=2.0 dropped all ")
    assert what.endswith(" candidates of the rank window [10, 100)")
    assert fix == ("lower mine.absolute_margin=2.0 (null turns a margin off), or give more documents to mine from "
                   "(mine.corpus_files=...), so that some survive")
    assert not (run / "mined.jsonl").exists()


def test_the_report_names_the_model_that_mined_the_share_of_real_candidates_and_the_run_overrides(
        make_cfg, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys):
    import json

    from gte_pro.modes import mine
    from gte_pro.train import train

    overrides = ["mode=mine", "debug=fast", "model.lr=0.002", "mine.num_negatives=4", "data.max_length=64"]
    monkeypatch.setattr(mine, "run_overrides", lambda: overrides)  # the command line's, as Hydra gives them
    train(make_cfg([*MINE, "model.lr=0.002", "mine.num_negatives=4"], output_dir=tmp_path / "mine"))
    report = json.loads((tmp_path / "mine" / "mine_report.json").read_text())
    # before: the packaged MiniLM's folder, whose tokenizer is all that the random model took from it
    assert report["model"].startswith("a randomly initialised bert (2 layers, hidden size 64) with the tokenizer of ")
    # 64 queries over a corpus of 64 documents: the window [10, 100) holds at most 53 of each query's candidates
    assert report["window_candidates"] <= 64 * 54 < 64 * 90
    share = report["dropped_false_negatives"] / report["window_candidates"]
    assert report["dropped_share_of_window"] == round(share, 4)
    command = [line for line in capsys.readouterr().out.splitlines() if line.startswith("train on it: ")][0]
    assert command.endswith(" debug=fast model.lr=0.002")  # before: both dropped
    assert "mine.num_negatives" not in command and "mode=mine" not in command


def test_the_overrides_carried_to_the_training_command():
    from gte_pro.mining.report import carried_overrides

    assert carried_overrides(["mode=mine", "model=gte_small", "+model.random_init_config.hidden_size=8", "debug=fast",
                              "data=jsonl", "data.train_file=x", "mine.range_max=50", "modelx=1"]) == [
        "model=gte_small", "+model.random_init_config.hidden_size=8", "debug=fast"]
