"""The rules across keys of a composed config: what no single key's type or range can say (a re-mining setting a
data source cannot follow, a reranker's model with an embedder's loss, two sources of one learning rate or node
count). ``gte_pro.config.checks.config_problems`` runs each; every problem is one line naming the keys."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gte_pro.config.schema.data import BeirData, DemoData, JsonlData, MixData
from gte_pro.models import OLD_TARGETS


class Problem(str):
    """A problem line whose fix is its own (``check_config`` makes it the error's fix line), not the generic one."""

    fix: str

    def __new__(cls, text: str, fix: str) -> Problem:
        problem = super().__new__(cls, text)
        problem.fix = fix
        return problem


def mix_problems(cfg: DictConfig) -> list[str]:
    """Re-mining reads one token cache; a mix has one per source."""
    remine = OmegaConf.select(cfg, "data.remine", default=None)
    if OmegaConf.select(cfg, "data._target_", default=None) == MixData._target_ and isinstance(
            remine, DictConfig) and (remine.get("every_n_epochs") or remine.get("at_start")):
        return ["data.remine: not supported with data=mix; set data.remine.every_n_epochs=0 "
                "data.remine.at_start=false"]
    return []


CROSS_ENCODER = "gte_pro.models.cross_encoder.CrossEncoder.load"
def _loss_targets(*options: str) -> dict[str, str]:
    """``_target_`` -> option name of conf/loss options, read from their schemas (where each target is stated)."""
    from gte_pro.config.schema import SCHEMAS

    return {SCHEMAS["loss"][name].__dataclass_fields__["_target_"].default: name for name in options}


RERANK_LOSSES = _loss_targets("listwise", "pointwise_bce")


def task_problems(cfg: DictConfig) -> list[str]:
    """task=rerank trains (mode=train) or evaluates (mode=eval) a cross-encoder with a reranking loss; task=embed
    neither."""
    task = cfg.get("task", "embed")
    model = OmegaConf.select(cfg, "model._target_", default=None, throw_on_missing=False)
    loss = OmegaConf.select(cfg, "loss._target_", default=None, throw_on_missing=False)
    rerank = task == "rerank"
    problems = []
    if isinstance(model, str) and (OLD_TARGETS.get(model, model) == CROSS_ENCODER) != rerank:
        problems.append(f"model: task={task} trains " + (
            "a cross-encoder: choose model=reranker_minilm, reranker_tiny, gte_reranker_modernbert, "
            "gte_multilingual_reranker, bge_reranker_base or cross_encoder model.name_or_path=..." if rerank else
            f"an embedder, and {model} is a reranker: add task=rerank, or choose an embedder (model=minilm, ...)"))
    if isinstance(loss, str) and (loss in RERANK_LOSSES) != rerank:
        problems.append(f"loss: task={task} " + ("needs a reranking loss: loss=listwise or loss=pointwise_bce"
                                                   if rerank else f"trains an embedder; {loss} is a reranker's loss"))
    if rerank and cfg.get("mode", "train") not in ("train", "eval"):
        problems.append(f"mode={cfg.get('mode')}: task=rerank runs mode=train or mode=eval (both rerank "
                        "eval.retriever's candidates); a trained reranker scores with mode=score or mine.rescore_with")
    if rerank and OmegaConf.select(cfg, "data.remine.every_n_epochs", default=0):
        problems.append("data.remine: re-mining refreshes an embedder's negatives; with task=rerank mine them first "
                        "(mode=mine) and set data.remine.every_n_epochs=0")
    return problems


def remine_problems(cfg: DictConfig) -> list[str]:
    """A teacher rescores the window in mode=mine only: re-mining during training mines with the embedder alone,
    each rank embedding its share of the corpus, which FSDP's sharded weights cannot do outside the training step."""
    remine = OmegaConf.select(cfg, "data.remine", default=None)
    if not (isinstance(remine, DictConfig) and (remine.get("every_n_epochs") or remine.get("at_start"))):
        return []
    problems = []
    teacher = OmegaConf.select(cfg, "mine.rescore_with", default=None, throw_on_missing=False)
    if teacher is not None:
        problems.append(f"mine.rescore_with={teacher!r}: not supported with data.remine (re-mining during training "
                        "mines with the embedder alone); mine with the teacher once (mode=mine "
                        "mine.rescore_with=...) and train on its file, or set mine.rescore_with=null")
    strategy = str(OmegaConf.select(cfg, "strategy._target_", default="") or "")
    if strategy.endswith("FSDPStrategy"):
        problems.append("data.remine: not supported with strategy=fsdp (each rank would embed the corpus with its "
                        "shards of the weights); use strategy=ddp, or mine between runs (mode=mine) and set "
                        "data.remine.every_n_epochs=0 data.remine.at_start=false")
    return problems


def lr_problems(cfg: DictConfig) -> list[str]:
    """The learning rate has one source of truth, model.lr (sweeps and lr_find set it; the module hands it to the
    optimizer): an optimizer.lr of another value would be silently replaced."""
    optimizer_lr = OmegaConf.select(cfg, "optimizer.lr", default=None, throw_on_missing=False)
    model_lr = OmegaConf.select(cfg, "model.lr", default=None, throw_on_missing=False)
    if optimizer_lr is None or optimizer_lr == model_lr:
        return []
    return [f"optimizer.lr={optimizer_lr!r} differs from model.lr={model_lr!r}: the learning rate is model.lr "
            f"alone (optimizer.lr follows it); set model.lr={optimizer_lr} instead"]


def topology_problems(cfg: DictConfig) -> list[str]:
    """``nodes`` is the one source of the node count: the trainer's num_nodes follows it."""
    nodes = OmegaConf.select(cfg, "nodes", default=None, throw_on_missing=False)
    num_nodes = OmegaConf.select(cfg, "trainer.num_nodes", default=None, throw_on_missing=False)
    if nodes is None or num_nodes is None or num_nodes == nodes:
        return []
    return [f"trainer.num_nodes={num_nodes!r} differs from nodes={nodes!r}: the node count is `nodes` alone "
            f"(trainer.num_nodes and hydra.launcher.nodes follow it); set nodes={num_nodes} instead"]


def matryoshka_problems(cfg: DictConfig) -> list[str]:
    """One weight per Matryoshka dimension, and no weights without dimensions."""
    dims = OmegaConf.select(cfg, "loss.matryoshka_dims", default=None, throw_on_missing=False)
    weights = OmegaConf.select(cfg, "loss.matryoshka_weights", default=None, throw_on_missing=False)
    if weights is not None and not dims:
        return [f"loss.matryoshka_weights={list(weights)}: set but loss.matryoshka_dims is not; give the dimensions "
                "(e.g. loss.matryoshka_dims=[384,256,128]) or drop the weights"]
    if dims and weights is not None and len(weights) != len(dims):
        return [f"loss.matryoshka_weights={list(weights)}: expected one weight per dimension of "
                f"loss.matryoshka_dims={list(dims)}"]
    return []


def mine_window_problems(cfg: DictConfig) -> list[str]:
    """The rank window [mine.range_min, mine.range_max) is not empty and holds mine.num_negatives."""
    low = OmegaConf.select(cfg, "mine.range_min", default=None, throw_on_missing=False)
    high = OmegaConf.select(cfg, "mine.range_max", default=None, throw_on_missing=False)
    wanted = OmegaConf.select(cfg, "mine.num_negatives", default=None, throw_on_missing=False)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high, wanted)):
        return []  # a bad value of one of them is named by its own rule
    if low >= high:
        return [f"mine.range_min={low}: must be smaller than mine.range_max={high}"]
    if wanted > high - low:
        return [f"mine.num_negatives={wanted}: more than the window holds (mine.range_max - mine.range_min = "
                f"{high - low})"]
    return []


DISTILL_LOSSES = _loss_targets("distill_kl", "margin_mse")
# data sources whose rows never carry teacher scores
UNSCORED_SOURCES = {DemoData._target_: "demo", BeirData._target_: "beir"}
JSONL_SOURCE = JsonlData._target_
NEGATIVE_FIELDS = ("negatives", "neg", "negative")  # gte_pro.data.records reads a row's negatives from one of them
SCORE_FIRST = ("score a JSON-lines file first (python train.py mode=score data=jsonl data.train_file=train.jsonl "
               "score.teacher=<reranker>) and train on its scored.jsonl with data=jsonl data.train_file=...")


def distill_problems(cfg: DictConfig) -> list[str]:
    """A distillation loss learns the teacher's scores over each row's positive and hard negatives: without
    either it would only fail at the first training step. The rows' scores are looked for in the first row of a
    JSON-lines file (cheap); the data module checks the whole file once read (``ContrastiveDataModule.setup``)."""
    loss = DISTILL_LOSSES.get(str(OmegaConf.select(cfg, "loss._target_", default="", throw_on_missing=False)))
    if loss is None:
        return []
    problems = []
    negatives = OmegaConf.select(cfg, "data.num_negatives", default=None, throw_on_missing=False)
    if negatives == 0:
        problems.append(f"data.num_negatives=0: loss={loss} distils the teacher's scores of each row's hard "
                        "negatives; set data.num_negatives=null (all of the file's own) or >= 1")
    source = str(OmegaConf.select(cfg, "data._target_", default="", throw_on_missing=False))
    if source in UNSCORED_SOURCES:
        problems.append(f"data={UNSCORED_SOURCES[source]}: loss={loss} needs teacher scores (pos_scores, "
                        f"neg_scores), which data={UNSCORED_SOURCES[source]} has none of: {SCORE_FIRST}; "
                        "or choose loss=infonce")
    train_file = training_file(cfg)
    if train_file is not None and not first_row_scored(train_file):
        fix = SCORE_FIRST if file_has_negatives(train_file) else mine_then_score(train_file)
        problems.append(f"data.train_file={train_file}: loss={loss} needs teacher scores and the file's first row "
                        f"has no pos_scores/neg_scores: {fix}; or choose loss=infonce")
    elif train_file is not None and negatives is None and not file_has_negatives(train_file):
        problems.append(Problem(f"data.train_file={train_file}: loss={loss} distils the teacher's scores of each "
                                "row's hard negatives, and no row of the file has any (scoring adds no negatives: "
                                "mining does)", fix=f"{mine_then_score(train_file)}; or choose loss=infonce"))
    elif train_file is not None and cfg.get("mode", "train") == "train":
        problems += weak_teacher_problems(cfg, loss, train_file)
    return problems


def training_file(cfg: DictConfig) -> str | None:
    """``data.train_file`` of data=jsonl (the one file a run trains on), or None."""
    source = str(OmegaConf.select(cfg, "data._target_", default="", throw_on_missing=False))
    train_file = OmegaConf.select(cfg, "data.train_file", default=None, throw_on_missing=False)
    return train_file if source == JSONL_SOURCE and isinstance(train_file, str) else None


def weak_teacher_problems(cfg: DictConfig, loss: str, train_file: str) -> list[str]:
    """A teacher that its record (``<train_file>.teacher.json``) shows weaker than the student, or near uniform at
    the temperature the loss reads it at, is refused before any model loads, unless loss.allow_weak_teacher=true
    (``gte_pro.scoring.teacher_file``)."""
    from gte_pro.scoring.teacher_file import chosen_temperature, read_record, weak_teacher_problem

    if OmegaConf.select(cfg, "loss.allow_weak_teacher", default=False, throw_on_missing=False) is True:
        return []
    record = read_record(train_file)
    if record is None:
        return []
    setting = OmegaConf.select(cfg, "loss.teacher_temperature", default=None, throw_on_missing=False)
    if setting != "auto" and not isinstance(setting, int | float):
        setting = None  # margin_mse (no softmax), or a bad value that its own rule names
    temperature = None if setting is None else chosen_temperature(setting, train_file)[0]
    problem = weak_teacher_problem(train_file, record, loss, temperature)
    return [] if problem is None else [problem]


def mine_then_score(source: str) -> str:
    from gte_pro.data.row_checks import mine_then_score as fix

    return fix(source)


def file_has_negatives(path: str) -> bool:
    """Whether a row of the JSON-lines file ``path`` carries a hard negative (read up to the first that does);
    True when there is no file to read (a missing file is the data module's error)."""
    from gte_pro.data.records import iter_jsonl
    from gte_pro.errors import DataError

    file = Path(path).expanduser()
    try:
        return not file.is_file() or any(isinstance(row, dict) and any(row.get(name) for name in NEGATIVE_FIELDS)
                                         for _, row in iter_jsonl(str(file)))
    except DataError:  # a malformed line: the data module names it, with the rest of its checks
        return True


def first_row_scored(path: str) -> bool:
    """Whether the first row of the JSON-lines file ``path`` has teacher scores; True when there is no file to
    read (a missing file is the data module's error, with its own message)."""
    from gte_pro.data.records import iter_jsonl  # the data package only when a distillation run needs it
    from gte_pro.data.scores import SCORE_FIELDS

    file = Path(path).expanduser()
    if not file.is_file():
        return True
    first = next(iter_jsonl(str(file)), (0, None))[1]
    return not isinstance(first, dict) or any(name in first for name in SCORE_FIELDS)


# launchers that start jobs through Hydra's sweep machinery: only `-m` (multirun) hands a job to them
SUBMITTING_LAUNCHERS = ("slurm", "local")


def launcher_problems(choices: Mapping[str, Any], multirun: bool) -> list[str]:
    """``hydra/launcher=slurm`` without ``-m``: Hydra runs the job here, on this machine, and never submits it.
    ``choices`` are Hydra's runtime choices (HydraConfig.get().runtime.choices) of a run started by train.py."""
    launcher = choices.get("hydra/launcher")
    if multirun or launcher not in SUBMITTING_LAUNCHERS:
        return []
    return [f"hydra/launcher={launcher}: a launcher only submits with -m (multirun); without it the job would run "
            f"on this machine. Add -m: python train.py -m hydra/launcher={launcher} ..."]


def hydra_launcher_problems() -> list[str]:
    """``launcher_problems`` of the running Hydra job; [] for a config composed without Hydra's runtime (the
    compose API of the tests, a notebook)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized():
        return []
    hydra = HydraConfig.get()
    return launcher_problems(hydra.runtime.choices, hydra.mode == RunMode.MULTIRUN)
