"""Every option of every config group composes through Hydra and instantiates into the object it names."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import OmegaConf

from gte_pro.config.checks import config_problems
from gte_pro.modes.build import build_encoder, build_strategy, build_trainer, instantiate_dict
from gte_pro.modes.build_data import build_datamodule
from tests.conftest import CONF

RERANKERS = ("cross_encoder", "reranker_minilm", "reranker_tiny", "gte_reranker_modernbert",
             "gte_multilingual_reranker", "bge_reranker_base")

GROUPS = ["model", "data", "loss", "optimizer", "scheduler", "strategy", "precision", "callbacks", "logger",
          "trainer", "debug", "experiment", "hparams_search"]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("option", RERANKERS)
def test_reranker_options_compose_with_task_rerank_and_pass_the_checks(make_cfg, option):
    extra = ["model.name_or_path=/somewhere"] if option == "cross_encoder" else []
    cfg = make_cfg(["task=rerank", f"model={option}", *extra])
    assert cfg.model._target_ == "gte_pro.models.cross_encoder.CrossEncoder.load" and cfg.model.lr > 0
    assert cfg.loss._target_ == "gte_pro.training.losses.ListwiseLoss" and cfg.data.num_negatives == 7
    assert config_problems(cfg) == []


def test_every_group_has_options_and_the_defaults_compose(make_cfg):
    cfg = make_cfg()
    for group in GROUPS:
        assert options(group), group
    assert cfg.model.name_or_path.endswith("model") and cfg.model.lr == 5e-5
    assert cfg.trainer.devices == 1 and cfg.trainer.precision == "32-true"
    assert OmegaConf.select(cfg, "data._target_") == "gte_pro.data.demo.DemoRows"


@pytest.mark.parametrize("option", [o for o in options("model") if o not in RERANKERS])
def test_model_options(make_cfg, option):
    overrides = [f"model={option}"] + (["model.name_or_path=/somewhere"] if option in ("encoder", "decoder") else [])
    cfg = make_cfg(overrides)
    assert cfg.model._target_ == "gte_pro.models.encoder.Encoder.load" and cfg.model.lr > 0
    assert cfg.model.max_length == cfg.data.max_length
    if option in ("minilm", "tiny"):  # the others load weights from the hub, which is not reachable here
        encoder = build_encoder(cfg)
        out = encoder.encode(["how do I sort a list in python", "sorting a python list", "rain in Paris tomorrow"])
        torch.testing.assert_close(out.norm(dim=-1), torch.ones(3))
        if option == "tiny":  # the random BERT of random_init_config, not the packaged weights
            assert out.shape == (3, cfg.model.random_init_config.hidden_size)
            assert encoder.backbone.config.num_hidden_layers == cfg.model.random_init_config.num_hidden_layers
        else:  # the packaged pretrained weights: related texts are closer than unrelated ones
            assert out.shape == (3, 384)
            assert float(out[0] @ out[1]) > float(out[0] @ out[2]) + 0.3
    elif option.startswith("gte_"):
        assert "gte" in cfg.model.name_or_path


@pytest.mark.parametrize("option", options("data"))
def test_data_options(make_cfg, option, tokenizer, pairs_file: Path, tmp_path: Path):
    extra = {"jsonl": [f"data.train_file={pairs_file}"], "hf": [f"data.path={tmp_path / 'hf'}"],
             "beir": [f"data.path={tmp_path / 'beir'}"],
             "mix": [f"data.sources={{a: {{type: jsonl, train_file: '{pairs_file}'}}}}"]}
    if option == "beir":
        from tests.beir_data import write_beir_folder

        write_beir_folder(tmp_path / "beir")
    if option == "hf":
        import datasets

        positives = [f"a positive text that explains topic {i} in more words than twelve tokens can hold"
                     for i in range(30)]
        datasets.Dataset.from_dict({"query": [f"a query about topic {i}" for i in range(30)],
                                    "positive": positives}).save_to_disk(str(tmp_path / "hf"))
    # settings other than the defaults: the batches must follow them
    cfg = make_cfg([f"data={option}", "data.batch_size=3", "data.max_length=12", "data.num_negatives=1",
                    "data.max_train_rows=30", *extra.get(option, [])])
    module = build_datamodule(cfg, tokenizer, "", "")
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["query"]["input_ids"].shape[0] == 3 and batch["num_negatives"] == 1
    assert batch["doc"]["input_ids"].shape == (6, 12)  # 3 positives + 3 negatives, truncated at max_length
    assert 0 < len(module.train_rows) <= 30 and all(rs.queries for _, rs in module.validation_sets())
    decoded = tokenizer.decode(batch["query"]["input_ids"][0], skip_special_tokens=True)
    assert any(decoded == tokenizer.decode(tokenizer(ex.query)["input_ids"][:11], skip_special_tokens=True)
               for ex in module.train_rows)  # the module's own tokenizer, no prefix


@pytest.mark.parametrize("option", [o for o in options("loss") if o not in ("listwise", "pointwise_bce")])
def test_loss_options(make_cfg, option):
    """Hand-computed values at the configured temperature: 4 orthonormal queries, each equal to its positive, then
    with the positives rolled by one (each query's positive orthogonal to it, another document equal to it). The
    reranker's losses: tests/test_rerank.py."""
    cfg = make_cfg([f"loss={option}"])
    loss = instantiate(cfg.loss)
    tau = cfg.loss.temperature
    q = torch.eye(4, 8, dtype=torch.float64)
    if option in ("distill_kl", "margin_mse"):
        # each query's positive equals it, its one negative (the previous query) is orthogonal: own scores [1, 0];
        # teacher scores [2, 0]. distill_kl: soft cross-entropy of softmax([2, 0]) against log_softmax([1, 0] / tau)
        # plus InfoNCE (weight 1) over 8 candidates, of which 2 equal the query; margin_mse: (1 - 2)^2, alone
        teacher = torch.tensor([[2.0, 0.0]] * 4, dtype=torch.float64)
        soft_ce = math.log1p(math.exp(-1 / tau)) + (1 / tau) / (math.exp(2) + 1)
        expected = {"distill_kl": soft_ce + math.log(2 + 6 * math.exp(-1 / tau)), "margin_mse": 1.0}
        out = loss(q, q, q.roll(1, dims=0)[:, None], teacher_scores=teacher)
        assert out.loss.item() == pytest.approx(expected[option], rel=1e-9)
        return
    # InfoNCE: q_i against 4 documents. GTE adds q->q, d->q and d->d terms (j != i each): the partition function of
    # pair i holds s(q_i, d_i) once (the numerator) and 12 zero similarities; rolled, q_i meets its equal once in
    # q->d and once in d->q (d_{i+1} = q_i), and 11 zeros
    aligned = {"infonce": math.log(1 + 3 * math.exp(-1 / tau)), "gte": math.log(1 + 12 * math.exp(-1 / tau))}
    rolled = {"infonce": math.log(math.exp(1 / tau) + 3), "gte": math.log(2 * math.exp(1 / tau) + 11)}
    assert loss(q, q).loss.item() == pytest.approx(aligned[option], rel=1e-9)
    assert loss(q, q.roll(1, dims=0)).loss.item() == pytest.approx(rolled[option], rel=1e-9)


@pytest.mark.parametrize("option", options("optimizer"))
@pytest.mark.parametrize("schedule", options("scheduler"))
def test_optimizer_and_scheduler_options(make_cfg, option, schedule):
    cfg = make_cfg([f"optimizer={option}", f"scheduler={schedule}"])
    weight = torch.nn.Parameter(torch.zeros(2))
    optimizer = instantiate(cfg.optimizer)([weight], lr=1e-3)
    assert type(optimizer).__name__.lower() == option
    scheduler_fn = instantiate(cfg.scheduler.fn)
    kwargs = {"num_training_steps": 10} if schedule != "constant" else {}
    scheduler = scheduler_fn(optimizer, num_warmup_steps=2, **kwargs)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        weight.grad = torch.ones(2)
        optimizer.step()
        scheduler.step()
    # linear warmup from 0 over 2 steps to the peak, then each schedule's own shape (step 6 is halfway down)
    after_warmup = {"constant": [1.0] * 8, "linear": [1 - s / 8 for s in range(8)],
                    "cosine": [0.5 * (1 + math.cos(math.pi * s / 8)) for s in range(8)]}[schedule]
    assert lrs == pytest.approx([1e-3 * f for f in [0.0, 0.5, *after_warmup]])
    # AdamW on a constant gradient moves each weight by ~lr per step, against the gradient
    assert weight.detach() == pytest.approx(torch.full((2,), -sum(lrs)), rel=1e-3)


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
        assert trainer.precision == option


@pytest.mark.parametrize("option", options("callbacks"))
def test_callback_options(make_cfg, option):
    callbacks = instantiate_dict(make_cfg([f"callbacks={option}"]).callbacks)
    names = {type(cb).__name__ for cb in callbacks}
    if option == "none":
        assert names == set()
    else:
        assert {"ModelCheckpoint", "EarlyStopping", "LearningRateMonitor", "Throughput", "ProgressBar"} <= names
    if option == "swa":
        assert "StochasticWeightAveraging" in names


@pytest.mark.parametrize("option", options("logger"))
def test_logger_options(make_cfg, option):
    loggers = instantiate_dict(make_cfg([f"logger={option}"]).logger)
    names = {type(lg).__name__ for lg in loggers}
    # a tracker keeps the CSV logger beside it: curves.png is drawn from its metrics.csv
    expected = {"csv": {"CSVLogger"}, "tensorboard": {"CSVLogger", "TensorBoardLogger"},
                "wandb": {"CSVLogger", "WandbLogger"},
                "many": {"CSVLogger", "TensorBoardLogger", "WandbLogger"}, "none": set()}[option]
    assert names == expected


def test_trainer_gets_devices_and_its_settings(make_cfg):
    cfg = make_cfg(["devices=2", "strategy=ddp", "trainer.max_steps=7", "trainer.accumulate_grad_batches=2",
                    "logger=none", "callbacks=none"])
    trainer = build_trainer(cfg, [], [])
    assert trainer.num_devices == 2 and trainer.max_steps == 7 and trainer.accumulate_grad_batches == 2
    assert type(trainer.strategy).__name__ == "DDPStrategy"


def _load(path: Path) -> dict:
    """A config file as Hydra reads it (2e-5 is a float), interpolations left as written."""
    return OmegaConf.to_container(OmegaConf.load(path), resolve=False)


def _leaves(node: object, prefix: str = "") -> dict[str, object]:
    """{"a.b": value} for every leaf of a config file, its defaults list left out."""
    if not isinstance(node, dict):
        return {prefix: node}
    return {k: v for key, child in node.items() if key != "defaults"
            for k, v in _leaves(child, f"{prefix}.{key}" if prefix else str(key)).items()}


@pytest.mark.parametrize("option", options("experiment"))
def test_experiment_presets_compose(make_cfg, option):
    """Every value the preset sets, and every value of the options it picks, is in the composed config."""
    cfg = make_cfg([f"experiment={option}", "data.train_file=x.jsonl"] if option == "byo_hard_negatives"
                   else [f"experiment={option}"])
    preset = _load(CONF / "experiment" / f"{option}.yaml")
    expected = _leaves(preset)
    for entry in preset["defaults"]:
        (group, choice), = entry.items()
        group = group.removeprefix("override /")
        picked = {f"{group}.{k}": v for k, v in _leaves(_load(CONF / group / f"{choice}.yaml")).items()
                  if not (isinstance(v, str) and (v.startswith("${") or v == "???"))}
        expected = {**picked, **expected}
    assert cfg.task_name == option and len(expected) > 3
    for key, value in expected.items():
        assert OmegaConf.select(cfg, key) == value, key


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


def test_the_learning_rate_has_one_source_of_truth(make_cfg):
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError

    cfg = make_cfg(["model.lr=1e-4"])
    check_config(cfg)
    assert cfg.optimizer.lr == cfg.model.lr == 1e-4  # optimizer.lr follows model.lr
    with pytest.raises(ConfigError, match=r"optimizer.lr=0.001 differs from model.lr=.*: the learning rate is "
                                          r"model.lr alone .*set model.lr=0.001 instead"):
        check_config(make_cfg(["optimizer.lr=1e-3"]))


def test_an_unknown_similarity_names_the_valid_ones(make_cfg):
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError

    with pytest.raises(ConfigError, match=r"loss.similarity='euclid': valid choices: cosine, dot"):
        check_config(make_cfg(["loss.similarity=euclid"]))


def test_eval_quantization_takes_the_known_precisions(make_cfg):
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError

    check_config(make_cfg(["eval.quantization=[int8,binary]"]))
    with pytest.raises(ConfigError, match=r"eval.quantization=\['int4'\]: expected a list of distinct values of: "
                                          r"int8, binary"):
        check_config(make_cfg(["eval.quantization=[int4]"]))


# --- schemas (gte_pro/config/schema/) -------------------------------------------------------------------------
@pytest.mark.parametrize(("override", "key", "type_name"), [
    ("data.batch_size=abc", "data.batch_size", "Integer"),
    ("model.lr=fast", "model.lr", "Float"),
    ("loss.temperature=[1]", "loss.temperature", "Float"),
    ("mine.range_max=1.5", "mine.range_max", "Integer"),
    ("eval.quantization=int8", "eval.quantization", "ListConfig"),
])
def test_a_schema_refuses_a_wrong_type_while_composing(make_cfg, override, key, type_name):
    from hydra.errors import ConfigCompositionException

    from gte_pro.errors import explain

    with pytest.raises(ConfigCompositionException) as refused:
        make_cfg([override])
    what, _ = explain(refused.value)
    assert override in what and type_name in what  # one line: the override as typed and the type it needed


def test_an_option_changes_a_schema_default_and_keeps_its_type(make_cfg):
    cfg = make_cfg(["data=demo", "loss=gte"])
    assert cfg.data.max_length == 128 and cfg.loss.temperature == 0.02 and cfg.loss.mask_own_negatives is False
    assert OmegaConf.get_type(cfg.data).__name__ == "DemoData" and OmegaConf.get_type(cfg.loss).__name__ == "GTESchema"
    assert make_cfg(["data.batch_size='64'"]).data.batch_size == 64  # a quoted number is read as the type says


@pytest.mark.parametrize("group", ["data", "model", "loss", "eval", "mine", "score"])
def test_every_option_of_a_schema_group_extends_a_schema(make_cfg, group):
    from gte_pro.config.schema import SCHEMAS

    schemas = tuple(SCHEMAS[group].values())
    for option in options(group):
        extra = {"data": ["data.train_file=x", "data.path=x", "data.sources={a: {type: demo}}"],
                 "model": ["model.name_or_path=x"]}.get(group, [])
        cfg = make_cfg([f"{group}={option}"] + [e for e in extra if e.split("=")[0].split(".")[1] in
                                               _option_keys(group, option)])
        assert issubclass(OmegaConf.get_type(cfg[group]), schemas), f"conf/{group}/{option}.yaml has no schema"


def _option_keys(group: str, option: str) -> set[str]:
    from gte_pro.config.schema import SCHEMAS

    node = OmegaConf.structured(SCHEMAS[group].get(option) or next(iter(SCHEMAS[group].values())))
    return set(node.keys())


@pytest.mark.parametrize(("overrides", "problem"), [
    (["loss.similarity=euclid"], "loss.similarity='euclid': valid choices: cosine, dot"),
    (["loss.temperature=0"], "loss.temperature=0.0: expected a number > 0"),
    (["loss.max_skipped_steps=-1"], "loss.max_skipped_steps=-1: expected an integer >= 0"),
    (["loss.mini_batch_size=0"], "loss.mini_batch_size=0: expected an integer >= 1, auto, or null"),
    (["loss=gte", "loss.mask_own_negatives=yes"], "loss.mask_own_negatives='yes': valid choices: true, false"),
    (["loss=distill_kl", "loss.teacher_temperature=0"], "loss.teacher_temperature=0: expected auto or a number > 0"),
    (["loss=margin_mse", "loss.weight_infonce=-1"], "loss.weight_infonce=-1.0: expected a number >= 0"),
    (["loss.matryoshka_dims=[32,16]", "loss.matryoshka_weights=[1.0]"],
     "loss.matryoshka_weights=[1.0]: expected one weight per dimension of loss.matryoshka_dims=[32, 16]"),
    (["loss=gte", "loss.matryoshka_weights=[1.0]"], "loss.matryoshka_weights=[1.0]: set but loss.matryoshka_dims"),
    (["loss.matryoshka_dims=[16,16]"], "loss.matryoshka_dims=[16, 16]: expected null or a list of distinct"),
    (["task=rerank", "loss.temperature=0"], "loss.temperature=0.0: expected a number > 0"),
    (["task=rerank", "loss=pointwise_bce", "loss.pos_weight=0"], "loss.pos_weight=0.0: expected a number > 0"),
    (["data.batch_size=1"], "data.batch_size=1: expected an integer >= 2"),
    (["resume=sometimes"], "resume='sometimes': valid choices: auto, never, force"),
    (["export.min_cosine=2"], "export.min_cosine=2.0: expected a number >= -1 and <= 1"),
    (["export.hf=yes"], "export.hf='yes': valid choices: true, false"),
    (["export.round_trip_max_abs_diff=-1"], "export.round_trip_max_abs_diff=-1.0: expected a number >= 0"),
])
def test_a_key_is_checked_once_by_its_schemas_rule(make_cfg, overrides, problem):
    """The constructors behind the targets no longer check these: the config check is the one place, and it names
    the key, the value and what is valid."""
    problems = config_problems(make_cfg(overrides))
    assert any(p.startswith(problem) for p in problems), problems
