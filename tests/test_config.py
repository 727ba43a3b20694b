"""Every option of every config group composes through Hydra and instantiates into the object it names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gte_pro.builders import build_encoder, build_strategy, build_trainer, instantiate_dict
from tests.conftest import CONF

GROUPS = ["model", "data", "loss", "optimizer", "scheduler", "strategy", "precision", "callbacks", "logger",
          "trainer", "debug", "experiment", "hparams_search"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def test_every_group_has_options_and_the_defaults_compose(make_cfg):
    cfg = make_cfg()
    for group in GROUPS:
        assert options(group), group
    assert cfg.model.name_or_path.endswith("model") and cfg.model.lr == 5e-5
    assert cfg.trainer.devices == 1 and cfg.trainer.precision == "32-true"
    assert OmegaConf.select(cfg, "data._target_") == "gte_pro.data.demo.DemoDataModule"


@pytest.mark.parametrize("option", options("model"))
def test_model_options(make_cfg, option):
    overrides = [f"model={option}"] + (["model.name_or_path=/somewhere"] if option == "encoder" else [])
    cfg = make_cfg(overrides)
    assert cfg.model._target_ == "gte_pro.model.Encoder" and cfg.model.lr > 0
    assert cfg.model.max_length == cfg.data.max_length
    if option in ("minilm", "tiny"):  # the others load weights from the hub, which is not reachable here
        encoder = build_encoder(cfg)
        assert encoder.encode(["hello"]).shape[0] == 1
    elif option.startswith("gte_"):
        assert "gte" in cfg.model.name_or_path


@pytest.mark.parametrize("option", options("data"))
def test_data_options(make_cfg, option, tokenizer, pairs_file: Path, tmp_path: Path):
    extra = {"jsonl": [f"data.train_file={pairs_file}"], "hf": [f"data.path={tmp_path / 'hf'}"],
             "beir": [f"data.path={tmp_path / 'beir'}"]}
    if option == "beir":
        from tests.beir_data import write_beir_folder

        write_beir_folder(tmp_path / "beir")
    if option == "hf":
        import datasets

        datasets.Dataset.from_dict({"query": ["a query"] * 2, "positive": ["a positive text"] * 2}).save_to_disk(
            str(tmp_path / "hf"))
    cfg = make_cfg([f"data={option}", *extra.get(option, [])])
    module = instantiate(cfg.data, tokenizer=tokenizer)
    assert module.batch_size == cfg.data.batch_size and module.tokenizer is tokenizer


@pytest.mark.parametrize("option", options("loss"))
def test_loss_options(make_cfg, option):
    loss = instantiate(make_cfg([f"loss={option}"]).loss)
    q = torch.nn.functional.normalize(torch.randn(4, 8), dim=-1)
    assert loss(q, q).loss.item() >= 0


@pytest.mark.parametrize("option", options("optimizer"))
@pytest.mark.parametrize("schedule", options("scheduler"))
def test_optimizer_and_scheduler_options(make_cfg, option, schedule):
    cfg = make_cfg([f"optimizer={option}", f"scheduler={schedule}"])
    optimizer = instantiate(cfg.optimizer)([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
    assert isinstance(optimizer, torch.optim.Optimizer)
    scheduler_fn = instantiate(cfg.scheduler.fn)
    kwargs = {"num_training_steps": 10} if schedule != "constant" else {}
    scheduler = scheduler_fn(optimizer, num_warmup_steps=2, **kwargs)
    assert scheduler.get_last_lr()[0] == 0.0  # warmup starts at 0


@pytest.mark.parametrize("option", options("strategy"))
def test_strategy_options(make_cfg, option):
    strategy = build_strategy(make_cfg([f"strategy={option}"]))
    if option == "auto":
        assert strategy == "auto"
    else:
        assert type(strategy).__name__.lower().startswith(option)


@pytest.mark.parametrize("option", options("precision"))
def test_precision_options_reach_the_trainer(make_cfg, option):
    cfg = make_cfg([f"precision={option}", "logger=none", "callbacks=none"])
    assert cfg.trainer.precision == option
    if option != "16-mixed":  # fp16 AMP needs a GPU; Lightning refuses it on the CPU
        trainer = build_trainer(cfg, [], [])
        assert type(trainer.precision_plugin).__name__ in {"Precision", "MixedPrecision"}


@pytest.mark.parametrize("option", options("callbacks"))
def test_callback_options(make_cfg, option):
    callbacks = instantiate_dict(make_cfg([f"callbacks={option}"]).callbacks)
    names = {type(cb).__name__ for cb in callbacks}
    if option == "none":
        assert names == set()
    else:
        assert {"ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "Throughput", "RichProgressBar"} <= names
    if option == "swa":
        assert "StochasticWeightAveraging" in names


@pytest.mark.parametrize("option", options("logger"))
def test_logger_options(make_cfg, option):
    loggers = instantiate_dict(make_cfg([f"logger={option}"]).logger)
    names = {type(lg).__name__ for lg in loggers}
    expected = {"csv": {"CSVLogger"}, "tensorboard": {"TensorBoardLogger"}, "wandb": {"WandbLogger"},
                "many": {"CSVLogger", "TensorBoardLogger", "WandbLogger"}, "none": set()}[option]
    assert names == expected


def test_trainer_gets_devices_and_its_settings(make_cfg):
    cfg = make_cfg(["devices=2", "strategy=ddp", "trainer.max_steps=7", "trainer.accumulate_grad_batches=2",
                    "logger=none", "callbacks=none"])
    trainer = build_trainer(cfg, [], [])
    assert trainer.num_devices == 2 and trainer.max_steps == 7 and trainer.accumulate_grad_batches == 2
    assert type(trainer.strategy).__name__ == "DDPStrategy"


@pytest.mark.parametrize("option", options("experiment"))
def test_experiment_presets_compose(make_cfg, option):
    cfg = make_cfg([f"experiment={option}", "data.train_file=x.jsonl"] if option == "byo_hard_negatives"
                   else [f"experiment={option}"])
    assert cfg.task_name == option


def test_debug_fast_uses_the_tiny_model(make_cfg):
    cfg = make_cfg(["debug=fast"])
    assert cfg.model.random_init_config.num_hidden_layers == 2 and cfg.trainer.limit_train_batches == 4


def test_lr_sweep_preset_sets_a_grid(make_cfg):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hparams_search=lr_sweep"], return_hydra_config=True)
    assert cfg.hydra.sweeper.params["model.lr"] == "1e-5,2e-5,5e-5"


def test_unknown_option_names_the_valid_choices(make_cfg):
    with pytest.raises(MissingConfigException) as err:
        make_cfg(["model=gte_huge"])
    message = str(err.value)
    assert "gte_huge" in message and "gte_small" in message and "minilm" in message


def test_optuna_preset_uses_the_optuna_sweeper(make_cfg):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["hparams_search=optuna"], return_hydra_config=True)
    assert "optuna" in cfg.hydra.sweeper._target_.lower() and cfg.hydra.sweeper.direction == "maximize"
    assert set(cfg.hydra.sweeper.params) == {"model.lr", "loss.temperature"}
