"""Defaults without traps (issue 30, item 2): a file's own hard negatives are used, a distillation run without
scores or negatives is refused before the model loads, a launcher without ``-m`` is refused, ``logger=wandb``
names its runs and keeps the CSV curves, and one function says where the cache is."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict

from gte_pro.config.checks import config_problems
from gte_pro.config.cross_keys import launcher_problems
from gte_pro.errors import DataError
from gte_pro.modes.build_data import data_module
from tests.conftest import CONF, write_jsonl


# --- data.num_negatives: null uses the file's own -----------------------------------------------------------------
def test_the_default_uses_every_negative_the_rows_carry(caplog: pytest.LogCaptureFixture):
    from gte_pro.data.row_checks import negatives_per_row

    counts = np.array([3, 1, 0, 3])
    with caplog.at_level(logging.INFO, logger="gte_pro.data.row_checks"):
        assert negatives_per_row(None, counts) == 3
    assert "3 hard negative(s) per row (data.num_negatives=null: the most any row carries)" in caplog.text
    assert "2 of 4 row(s) have fewer and are filled with other rows' positives" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="gte_pro.data.row_checks"):
        negatives_per_row(None, np.array([3, 1, 2, 3]))
    assert "the rows carry 1 to 3 (mean 2.2); 2 of 4 row(s) have fewer" in caplog.text  # the fewest is 1, not 0
    assert negatives_per_row(1, counts) == 1  # an explicit integer is kept
    assert negatives_per_row(None, np.array([], dtype=np.int64)) == 0  # no rows carry any: in-batch only


def test_a_files_negatives_reach_the_batches_by_default(make_cfg, pairs_file: Path, tokenizer, tmp_path: Path):

    cfg = make_cfg(["data=jsonl", f"data.train_file={pairs_file}"])
    assert cfg.data.num_negatives is None  # before: 0, and the file's 2 negatives per row were dropped
    module = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, batch_size=4, val_fraction=0.2,
                         cache_dir=str(tmp_path / "c"))
    module.prepare_data()
    module.setup("fit")
    assert module.num_negatives == 2
    assert next(iter(module.train_dataloader()))["num_negatives"] == 2


# --- distillation without negatives or scores: refused before anything loads ------------------------------------
def _scored(path: Path, negatives: int = 2) -> Path:
    return write_jsonl(path, [{"query": f"what is topic number {i}?",
                               "pos": [f"Topic {i} is a subject that covers item {i} in depth, with examples."],
                               "neg": [f"Unrelated passage {i}-{j} about the weather in city {j}."
                                       for j in range(negatives)],
                               "pos_scores": [0.9], "neg_scores": [0.1] * negatives} for i in range(40)])


def test_distillation_without_scores_or_negatives_is_refused_by_the_config_check(make_cfg, pairs_file: Path,
                                                                                 tmp_path: Path):
    problems = config_problems(make_cfg(["loss=distill_kl"]))  # the demo data
    assert any(p.startswith("data=demo: loss=distill_kl needs teacher scores") and "mode=score" in p
               for p in problems), problems
    problems = config_problems(make_cfg(["loss=margin_mse", "data=jsonl", f"data.train_file={pairs_file}"]))
    assert any(p.startswith(f"data.train_file={pairs_file}: loss=margin_mse needs teacher scores") for p in problems)
    scored = str(_scored(tmp_path / "scored.jsonl"))
    problems = config_problems(make_cfg(["loss=distill_kl", "data=jsonl", f"data.train_file={scored}",
                                         "data.num_negatives=0"]))
    assert problems == ["data.num_negatives=0: loss=distill_kl distils the teacher's scores of each row's hard "
                        "negatives; set data.num_negatives=null (all of the file's own) or >= 1"]
    # the command mode=score prints: the default num_negatives takes the file's scored negatives
    assert config_problems(make_cfg(["loss=distill_kl", "data=jsonl", f"data.train_file={scored}"])) == []


def test_scored_rows_without_negatives_fail_when_the_data_is_read(tokenizer, tmp_path: Path):

    path = _scored(tmp_path / "scored.jsonl", negatives=0)
    # what gte_pro.modes.build hands the data module for loss=distill_kl
    module = data_module("jsonl", train_file=str(path), tokenizer=tokenizer, batch_size=4, val_fraction=0.2,
                         cache_dir=str(tmp_path / "c"), distill_loss="distill_kl")
    module.prepare_data()
    with pytest.raises(DataError, match=rf"{path}: loss=distill_kl needs hard negatives in the training rows"):
        module.setup("fit")


# --- a launcher without -m -----------------------------------------------------------------------------------------
def test_a_launcher_without_multirun_is_refused():
    assert launcher_problems({"hydra/launcher": "slurm"}, multirun=False) == [
        "hydra/launcher=slurm: a launcher only submits with -m (multirun); without it the job would run on this "
        "machine. Add -m: python train.py -m hydra/launcher=slurm ..."]
    assert launcher_problems({"hydra/launcher": "local"}, multirun=True) == []
    assert launcher_problems({"hydra/launcher": "basic"}, multirun=False) == []


@pytest.mark.parametrize("mode,refused", [(RunMode.RUN, True), (RunMode.MULTIRUN, False)])
def test_the_check_reads_the_running_jobs_hydra_config(tmp_path: Path, mode: RunMode, refused: bool):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hydra/launcher=local"], return_hydra_config=True)
    with open_dict(cfg):
        cfg.hydra.mode = mode
        cfg.paths.output_dir = str(tmp_path)
    HydraConfig.instance().set_config(cfg)
    try:
        problems = [p for p in config_problems(cfg) if p.startswith("hydra/launcher")]
    finally:
        HydraConfig.instance().cfg = None  # composed configs of the next tests have no Hydra runtime
        GlobalHydra.instance().clear()
    assert bool(problems) == refused, problems


# --- one cache root ------------------------------------------------------------------------------------------------
def test_one_function_says_where_the_cache_is(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    from gte_pro.utils.cache import cache_root

    monkeypatch.setenv("GTE_PRO_CACHE", str(tmp_path / "env"))
    assert cache_root() == tmp_path / "env" and cache_root(tmp_path / "set") == tmp_path / "set"
    monkeypatch.delenv("GTE_PRO_CACHE")
    assert cache_root() == Path("~/.cache/gte_pro").expanduser()
    # no other module spells the default out (four did, and two of them ignored $GTE_PRO_CACHE)
    package = Path(__file__).resolve().parents[1] / "gte_pro"
    spelled = [str(p.relative_to(package)) for p in package.rglob("*.py") if ".cache/gte_pro" in p.read_text()]
    assert spelled == ["utils/cache.py"], spelled


def test_the_config_and_the_tiny_tokenizer_follow_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("GTE_PRO_CACHE", str(tmp_path / "env"))
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        assert compose("train").paths.cache_dir == str(tmp_path / "env")
        cfg = compose("train", overrides=["model=tiny_qwen2", f"paths.cache_dir={tmp_path / 'set'}"])
    GlobalHydra.instance().clear()
    # before: the tiny tokenizer went to $GTE_PRO_CACHE whatever paths.cache_dir said
    assert Path(cfg.model.name_or_path).is_relative_to(tmp_path / "set")


# --- trackers: named runs, and the CSV curves beside them ------------------------------------------------------------
@pytest.mark.parametrize("logger,names", [("wandb", ["csv", "wandb"]), ("tensorboard", ["csv", "tensorboard"]),
                                          ("many", ["csv", "tensorboard", "wandb"])])
def test_the_csv_logger_stays_on_beside_a_tracker(make_cfg, logger: str, names: list[str]):
    assert list(make_cfg([f"logger={logger}"]).logger) == names  # before: logger=wandb had no csv, no curves.png


def test_sweep_jobs_get_wandb_names_of_their_own(tmp_path: Path):
    GlobalHydra.instance().clear()
    names = []
    for num, lr in enumerate(["1e-5", "2e-5"]):
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("train", overrides=["logger=wandb", f"model.lr={lr}", "hparams_search=lr_sweep"],
                          return_hydra_config=True)
        GlobalHydra.instance().clear()
        with open_dict(cfg):
            cfg.hydra.mode, cfg.hydra.job.num = RunMode.MULTIRUN, num
        HydraConfig.instance().set_config(cfg)
        try:
            names.append(cfg.logger.wandb.name)
        finally:
            HydraConfig.instance().cfg = None
    # before: both were "train" (the task name), in every sweep
    assert names == ["train-0 model.lr=1e-5 hparams_search=lr_sweep", "train-1 model.lr=2e-5 hparams_search=lr_sweep"]
    assert compose_name_without_hydra() == "train"


def compose_name_without_hydra() -> str:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        name = compose("train", overrides=["logger=wandb"]).logger.wandb.name
    GlobalHydra.instance().clear()
    return name
