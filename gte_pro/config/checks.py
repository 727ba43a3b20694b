"""The composed config, checked before anything is built.

Every key's type, default, meaning and rule is stated once, in its group's schema (gte_pro/config/schema/): Hydra
enforces the types while it composes, and ``check_config`` applies each field's rule here, so that a wrong value
does not surface as a ``TypeError`` deep inside a data module or Lightning, or not at all (``seed=-1`` silently
becomes seed 0, ``model.trust_remote_code="false"`` is a true string): ranges, choices, booleans, keys added with
``+`` that no schema knows, and the rules across keys (``cross_keys``). ``check_config`` names every bad key, its
value and what is valid, in one error. The constructors behind the ``_target_`` take these checked values as they
are and do not check them again.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import Field, fields, is_dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import InterpolationResolutionError

from gte_pro.config.cross_keys import (
    Problem,
    distill_problems,
    hydra_launcher_problems,
    lr_problems,
    matryoshka_problems,
    mine_window_problems,
    mix_problems,
    remine_problems,
    task_problems,
    topology_problems,
)
from gte_pro.config.guide_checks import guide_problems
from gte_pro.config.known_keys import spelling_hint, static_keys, valid_keys
from gte_pro.config.rules import Rule
from gte_pro.config.schema import SCHEMAS, schema_for
from gte_pro.config.schema.data import DataCommon
from gte_pro.errors import ConfigError

_ABSENT = object()
REQUIRED_GROUPS = ("model", "data", "loss", "optimizer", "trainer")
CHECKED_GROUPS = ("", "trainer", "data", "model", "loss", "eval", "mine", "score", "merge", "sweep", "export")
_HYDRA_KEYS = {"_target_", "_partial_", "_recursive_", "_convert_", "_args_"}


def schema_fields(schema: type, prefix: str = "") -> Iterator[tuple[str, Field]]:
    """(dotted key, field) of every setting of ``schema``, nested schemas (``data.remine.*``) flattened."""
    for item in fields(schema):
        if item.name == "_target_":
            continue
        if is_dataclass(item.type):
            yield from schema_fields(item.type, f"{prefix}{item.name}.")
        else:
            yield f"{prefix}{item.name}", item


def _group_node(cfg: DictConfig, group: str) -> Any:
    return cfg if group == "" else cfg.get(group)


def _schemas_of(cfg: DictConfig) -> Iterator[tuple[str, type]]:
    """(key prefix, schema) of each checked group of ``cfg`` whose schema is known."""
    for group in CHECKED_GROUPS:
        node = _group_node(cfg, group)
        if not isinstance(node, DictConfig):
            continue
        schema = schema_for(group, node.get("_target_") if group else None)
        if schema is not None:
            yield (f"{group}." if group else ""), schema


def _source_schemas(cfg: DictConfig) -> Iterator[tuple[str, type]]:
    """data=mix: each source follows its type's schema (the keys every source shares at least)."""
    sources = OmegaConf.select(cfg, "data.sources", default=None, throw_on_missing=False)
    if not isinstance(sources, DictConfig):
        return
    for name, source in sources.items():
        kind = source.get("type") if isinstance(source, DictConfig) else None
        yield f"data.sources.{name}.", SCHEMAS["data"].get(kind, DataCommon)


def key_rules(cfg: DictConfig) -> dict[str, Rule]:
    """key -> rule of every key of ``cfg`` that a schema gives a rule."""
    return {prefix + key: item.metadata["rule"]
            for prefix, schema in [*_schemas_of(cfg), *_source_schemas(cfg)]
            for key, item in schema_fields(schema) if item.metadata.get("rule") is not None}


def _unknown_keys(cfg: DictConfig) -> dict[str, str]:
    """key -> problem, for each key no schema or conf/ file knows: ``+data.bogus=1`` composes (``+`` may add a key
    to a typed node), then would fail as ``unexpected keyword argument`` (the schema's keys are listed);
    ``+trainer.max_epoch=2`` would fail so once the model has loaded, and ``+lr=1e-4`` would be read by nothing."""
    problems = {}
    for prefix, schema in _schemas_of(cfg):
        if prefix in ("", "trainer."):
            continue
        known = {key for key, _ in schema_fields(schema)}
        node = OmegaConf.to_container(OmegaConf.select(cfg, prefix[:-1]), resolve=False)
        written = {key for key, _ in _leaves(node) if key.split(".")[0] not in _HYDRA_KEYS}
        # a dict-valued setting (model.lora, data.sources, ...) is one key however deep its value
        unknown = sorted(key for key in written if not any(key == k or key.startswith(f"{k}.") for k in known))
        problems |= {f"{prefix}{key}": f"{prefix}{key}: not a setting of {schema.__name__}; valid keys: "
                     f"{', '.join(sorted(known))}" for key in unknown}
    return problems | _unknown_top_or_trainer_keys(cfg)


def _unknown_top_or_trainer_keys(cfg: DictConfig) -> dict[str, str]:
    """The top level holds the groups and RunSchema's keys; the trainer, conf/trainer's keys and any argument of
    Lightning's Trainer. A top-level key whose value is an interpolation (``+wandb_key=${oc.env:WANDB_API_KEY}``)
    is a user's variable for other keys to read, and stays."""
    problems = {}
    for key in cfg.keys():
        written = cfg._get_node(key)._value()
        if str(key) in static_keys() or (isinstance(written, str) and "${" in written):
            continue
        problems[str(key)] = f"{key}: not a key of this config (a typo, or a key that belongs to a group)"
    trainer = cfg.get("trainer")
    if isinstance(trainer, DictConfig):
        for key in trainer.keys():
            dotted = f"trainer.{key}"
            if dotted not in static_keys() and key not in _HYDRA_KEYS and dotted not in valid_keys(dotted):
                problems[dotted] = f"{dotted}: neither a Lightning Trainer argument nor a key of conf/trainer"
    return problems


def _unknown_keys_hint(cfg: DictConfig, unknown: list[str]) -> str:
    written = {}
    for key in unknown:
        value = OmegaConf.select(cfg, key, default=None, throw_on_missing=False)
        written[key] = "" if OmegaConf.is_config(value) or value is None else str(value)
    return spelling_hint(written)


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


def config_problems(cfg: DictConfig) -> list[str]:
    """Every problem of ``cfg`` as one line naming the key, its value and what is valid; [] for a good config."""
    unusable = _unset_or_unresolvable(cfg)
    problems = _absent_groups(cfg) + list(unusable.values()) + mix_problems(cfg) + remine_problems(cfg)
    if "optimizer.lr" not in unusable and "model.lr" not in unusable:
        problems += lr_problems(cfg)
    problems += topology_problems(cfg) + task_problems(cfg) + matryoshka_problems(cfg) + mine_window_problems(cfg)
    problems += distill_problems(cfg) + guide_problems(cfg) + hydra_launcher_problems()
    for key, rule in key_rules(cfg).items():
        if key in unusable:
            continue
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            continue  # not part of this config (e.g. a data source without max_distractors)
        if OmegaConf.is_config(value):
            value = OmegaConf.to_container(value, resolve=True)
        if (problem := rule(value)) is not None:
            problems.append(f"{key}={value!r}: {problem}")
    return problems + list(_unknown_keys(cfg).values())


def check_config(cfg: DictConfig) -> None:
    """Raise ConfigError listing every bad key of ``cfg`` (see ``config_problems``); with unknown keys, the fix
    names the valid key nearest to each."""
    problems = config_problems(cfg)
    if problems:
        unknown = list(_unknown_keys(cfg))
        fixes = [problem.fix for problem in problems if isinstance(problem, Problem)]
        fixes += [_unknown_keys_hint(cfg, unknown)] if unknown else []
        hint = "; ".join(fixes) if fixes else None
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems), hint=hint)
