"""The composed config, checked before anything is built.

The schemas of gte_pro/config/schema/ give the data, model, loss, eval and mine keys their types, which Hydra
enforces while it composes. What a type cannot say is checked here, so that a wrong value does not surface as a
``TypeError`` deep inside a data module or Lightning, or not at all (``seed=-1`` silently becomes seed 0,
``model.trust_remote_code="false"`` is a true string): ranges, choices, booleans, the keys no schema types, and
the rules across keys. ``check_config`` names every bad key, its value and what is valid, in one error.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.utils import get_object
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from gte_pro.config.cross_keys import (
    distill_problems,
    hydra_launcher_problems,
    lr_problems,
    mix_problems,
    remine_problems,
    task_problems,
    topology_problems,
)
from gte_pro.config.rules import (
    FLAG,
    at_least,
    choice,
    devices_value,
    int_list,
    integer,
    known_keys,
    number,
    number_list,
    subset,
)
from gte_pro.errors import ConfigError
from gte_pro.models.heads import PROJECTION_KEYS
from gte_pro.models.lora import LORA_KEYS

_ABSENT = object()
REQUIRED_GROUPS = ("model", "data", "loss", "optimizer", "trainer")


# What a type cannot say. The model, loss, eval and mine keys are typed by their schemas (gte_pro/config/schema/:
# Hydra refuses a wrong type while composing, naming the key), so their rules are ranges and choices. The top level
# and the trainer have no schema (the trainer passes any Lightning argument through), booleans are checked here on
# purpose (OmegaConf would read "yes" or 1 as true), and the data.* rules keep their types: they also check each
# source of data=mix (data.sources.<name>.<key>), which no schema types.
RULES: dict[str, Callable[[Any], str | None]] = {
    # numpy's range: Lightning replaces any other seed by 0, with only a warning
    "seed": lambda v: integer(0)(v) or (None if v <= 2**32 - 1 else "expected an integer <= 4294967295"),
    "devices": devices_value,
    "nodes": integer(1),
    "mode": choice("train", "eval", "mine", "score"),
    "task": choice("embed", "rerank"),
    "lr_find": FLAG,
    "lr_find_steps": integer(1),
    "matmul_precision": choice("highest", "high", "medium"),
    "model.lr": number(),  # its sign is torch's to check ("Invalid learning rate: -1")
    "model.trust_remote_code": FLAG,
    "model.pooling": choice("mean", "cls", "last", None),
    "model.normalize": choice(True, False, None),
    "model.max_length": at_least(1),
    "model.gradient_checkpointing": FLAG,
    "model.compile": FLAG,
    "model.padding_side": choice("left", "right", None),
    "model.append_eos": FLAG,
    "model.length_chunks": lambda v: None if v == "auto" or not integer(1)(v) else "expected auto or an integer >= 1",
    "model.lora": lambda v: known_keys(v, LORA_KEYS, "{r: 16, alpha: 32, dropout: 0.1}"),
    "model.projection": lambda v: known_keys(v, PROJECTION_KEYS, "{dims: [512, 512], activation: relu, dropout: 0.1}"),
    "loss.temperature": number(0, open_low=True),
    "loss.mini_batch_size": at_least(1),
    "loss.max_skipped_steps": at_least(0),
    "loss.similarity": choice("cosine", "dot"),
    "loss.matryoshka_dims": lambda v: int_list(v, 1),
    "loss.matryoshka_weights": lambda v: number_list(v),
    "loss.weight_infonce": number(0),  # loss=distill_kl, margin_mse
    "loss.teacher_temperature": number(0, open_low=True),
    "data.batch_size": integer(2),
    "data.eval_batch_size": integer(1),
    "data.num_negatives": integer(0, optional=True),
    "data.max_length": integer(1),
    "data.num_workers": integer(0),
    "data.val_fraction": number(0, 1, open_high=True),
    "data.max_val_queries": integer(1, optional=True),
    "data.max_train_rows": integer(1, optional=True),
    "data.min_query_chars": integer(0),
    "data.min_doc_chars": integer(0),
    "data.length_window": integer(1),
    "data.max_distractors": integer(0, optional=True),
    "data.alpha": number(0),  # data=mix
    "data.same_source_batches": FLAG,
    "data.group_by_length": FLAG,
    "data.pin_memory": FLAG,
    "data.persistent_workers": FLAG,
    "data.remine.every_n_epochs": integer(0),
    "data.remine.at_start": FLAG,
    "trainer.max_epochs": integer(-1, optional=True),
    "trainer.memory_budget": lambda v: None if v in (None, "auto") else number(0, open_low=True)(v)
    and "expected auto, a number of GiB > 0, or null",
    "trainer.max_steps": integer(-1),
    "trainer.accumulate_grad_batches": integer(1),
    "trainer.log_every_n_steps": integer(0),
    "trainer.gradient_clip_val": number(0, optional=True),
    "trainer.limit_train_batches": number(0, optional=True),
    "trainer.val_check_interval": number(0, open_low=True, optional=True),
    "trainer.check_val_every_n_epoch": integer(1, optional=True),
    "trainer.num_sanity_val_steps": integer(-1),
    "eval.batch_size": at_least(1),
    "eval.max_length": at_least(1),
    "eval.quantization": subset("int8", "binary"),
    "eval.truncate_dims": lambda v: int_list(v, 1),
    "eval.before": FLAG,
    "eval.rerank_depth": at_least(1),  # task=rerank
    "eval.retriever_batch_size": at_least(1),
    "loss.pos_weight": number(0, open_low=True, optional=True),  # loss=pointwise_bce
    # mining (mode=mine); the cross-key rules (range_min < range_max) are gte_pro.mining.options.option_problems'
    "mine.num_negatives": at_least(1),
    "mine.range_min": at_least(0),
    "mine.range_max": at_least(1),
    "mine.sampling": choice("top", "random"),
    "mine.relative_margin": number(0, optional=True),
    "mine.absolute_margin": number(0, optional=True),
    "mine.max_score": number(optional=True),
    "mine.batch_size": at_least(1),
    "mine.max_length": at_least(1),
    "mine.max_scores_per_chunk": at_least(1),
    "mine.rescore_with": lambda v: None if v is None or (isinstance(v, str) and v.strip()) else
    "expected the teacher's folder or hub name, or null",
    "mine.rescore_kind": choice(None, "cross-encoder", "embedder"),
    "mine.rescore_batch_size": at_least(1),
    "mine.rescore_max_length": at_least(1),
    # teacher scores (mode=score); score.teacher and score.input are checked when mode=score runs
    "score.teacher_kind": choice("cross-encoder", "embedder", None),
    "score.trust_remote_code": FLAG,
    "score.batch_size": at_least(1),
    "score.max_length": at_least(1),
    "score.shard_rows": at_least(1),
}

# keys of a node that are not arguments of its target (build_encoder hands model.lr to the optimizer)
_NOT_ARGUMENTS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}
_EXTRA_KEYS = {"model": {"lr"}}


def _accepted_arguments(target: str) -> set[str] | None:
    """The keyword arguments a class accepts, following ``**kwargs`` up its bases; None if it takes any."""
    cls = get_object(target)
    names: set[str] = set()
    for klass in inspect.getmro(cls) if inspect.isclass(cls) else [cls]:
        init = klass.__init__ if inspect.isclass(klass) else klass
        if inspect.isclass(klass) and "__init__" not in vars(klass):
            continue
        params = list(inspect.signature(init).parameters.values())
        names |= {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            return names - {"self"}
    return None


def _unknown_keys(cfg: DictConfig) -> list[str]:
    """``+data.bogus=1`` composes, then fails as ``unexpected keyword argument``: name it and the valid keys."""
    problems = []
    for group in ("data", "model", "loss"):
        node = cfg.get(group)
        target = node.get("_target_") if isinstance(node, DictConfig) else None
        if not isinstance(target, str) or not target.startswith("gte_pro."):
            continue
        accepted = _accepted_arguments(target)
        if accepted is None:
            continue
        valid = accepted | _NOT_ARGUMENTS | _EXTRA_KEYS.get(group, set())
        for key in sorted(set(node.keys()) - valid):
            problems.append(f"{group}.{key}: not a setting of {target}; valid keys: "
                            f"{', '.join(sorted(valid - _NOT_ARGUMENTS))}")
    return problems


def _leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value as written) of every leaf, ``hydra.*`` left out."""
    if isinstance(node, dict):
        return [leaf for key, child in node.items() if f"{prefix}{key}" != "hydra"
                for leaf in _leaves(child, f"{prefix}{key}.")]
    return [(prefix[:-1], node)]


def _unset_or_unresolvable(cfg: DictConfig) -> dict[str, str]:
    """key -> problem, for each ``???`` left unset and each ``${...}`` that cannot be resolved (a typo, an unset
    environment variable, a removed group)."""
    problems = {}
    for key, written in _leaves(OmegaConf.to_container(cfg, resolve=False)):
        if written == "???":
            problems[key] = f"{key} is required: set {key}=..."
            continue
        try:
            OmegaConf.select(cfg, key, throw_on_missing=False)
        except InterpolationResolutionError as err:
            problems[key] = f"{key}: cannot be resolved ({str(err).splitlines()[0]})"
    return problems


def _absent_groups(cfg: DictConfig) -> list[str]:
    """``model=null`` or ``~model`` leaves a run without a part it cannot do without."""
    conf = Path(__file__).resolve().parents[2] / "conf"
    return [f"{group}: no option chosen; valid choices: "
            f"{', '.join(sorted(p.stem for p in (conf / group).glob('*.yaml'))) or '(see conf/)'}"
            for group in REQUIRED_GROUPS if not isinstance(cfg.get(group), DictConfig)]


def _source_rules(cfg: DictConfig) -> dict[str, Callable[[Any], str | None]]:
    """data=mix: a source's own key data.sources.<name>.<key> follows the rule of data.<key>."""
    sources = OmegaConf.select(cfg, "data.sources", default=None, throw_on_missing=False)
    if not isinstance(sources, DictConfig):
        return {}
    return {f"data.sources.{name}.{key.removeprefix('data.')}": rule for name in sources
            for key, rule in RULES.items() if key.startswith("data.")}


def config_problems(cfg: DictConfig) -> list[str]:
    """Every problem of ``cfg`` as one line naming the key, its value and what is valid; [] for a good config."""
    unusable = _unset_or_unresolvable(cfg)
    problems = _absent_groups(cfg) + list(unusable.values()) + mix_problems(cfg) + remine_problems(cfg)
    if "optimizer.lr" not in unusable and "model.lr" not in unusable:
        problems += lr_problems(cfg)
    problems += topology_problems(cfg) + task_problems(cfg) + distill_problems(cfg) + hydra_launcher_problems()
    for key, rule in {**RULES, **_source_rules(cfg)}.items():
        if key in unusable:
            continue
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            continue  # not part of this config (e.g. a data source without max_distractors)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if (problem := rule(value)) is not None:
            problems.append(f"{key}={value!r}: {problem}")
    return problems + _unknown_keys(cfg)


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every bad key of ``cfg`` (see ``config_problems``)."""
    problems = config_problems(cfg)
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
