"""Every key a config can hold, and the valid key nearest to a misspelled one.

A misspelled key must not pass (``+lr=1e-4`` added a top-level key that nothing read) nor end in a traceback once
the model has loaded (``+trainer.max_epoch=2``: Lightning's ``unexpected keyword argument``); and its fix line
names the key the user meant (``model.lr``, ``trainer.max_epochs``), not ``+key=value``, which only adds the typo.

The keys: the schemas' (``gte_pro.config.schema``), the leaves of every option's YAML file under conf/ (optimizer,
scheduler, paths, ... and the ``_global_`` presets), the group names, and the Lightning ``Trainer``'s arguments
(read only when a trainer key is not one of conf/trainer's, since ``lightning`` takes seconds to import).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import re
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from gte_pro import errors

CONF = Path(__file__).resolve().parents[2] / "conf"
# groups whose keys are free-form: a new callback, a launcher's sbatch option, a logger's argument
FREE_FORM = ("callbacks", "hydra", "logger")
# where a key that exists in several groups is most likely meant (``lr``: model.lr, not optimizer.lr)
PREFERRED = ("", "model", "data", "loss", "trainer", "mine", "score", "eval", "export")


def _leaves(node: object, prefix: str) -> set[str]:
    if isinstance(node, DictConfig):
        out = {prefix[:-1]} if prefix else set()
        for key in node.keys():
            if str(key) not in ("defaults", "hydra"):
                out |= _leaves(node._get_node(key), f"{prefix}{key}.")  # no interpolation is resolved
        return out
    return {prefix[:-1]}


def _yaml_keys() -> set[str]:
    """The dotted keys the YAML files of conf/ write (a group's under its name; ``_global_`` presets as written)."""
    keys = set()
    for path in CONF.glob("*/*.yaml"):
        text = path.read_text(encoding="utf-8")
        node = OmegaConf.create(OmegaConf.load(path))
        prefix = "" if re.search(r"^# @package _global_\s*$", text, re.MULTILINE) else f"{path.parent.name}."
        keys |= _leaves(node, prefix)
    return keys


def _schema_keys(schema: type, prefix: str = "") -> set[str]:
    """The dotted keys of a schema, nested schemas (``data.remine.*``) flattened (as ``checks.schema_fields``)."""
    keys = set()
    for item in dataclasses.fields(schema):
        if dataclasses.is_dataclass(item.type):
            keys |= _schema_keys(item.type, f"{prefix}{item.name}.")
        elif item.name != "_target_":
            keys.add(f"{prefix}{item.name}")
    return keys


@functools.cache
def static_keys() -> frozenset[str]:
    """Every key of conf/ and of the schemas, without the Lightning Trainer's own arguments."""
    from gte_pro.config.schema import FIXED_SCHEMAS, SCHEMAS

    keys = {p.name for p in CONF.iterdir() if p.is_dir()} | _yaml_keys()
    for group, schema in [*FIXED_SCHEMAS.items(), *((g, s) for g, o in SCHEMAS.items() for s in o.values())]:
        keys |= {f"{group}.{key}" if group else key for key in _schema_keys(schema)}
    return frozenset(keys)


@functools.cache
def trainer_arguments() -> frozenset[str]:
    """``trainer.<argument>`` of every argument of Lightning's ``Trainer``."""
    from lightning.pytorch import Trainer

    return frozenset(f"trainer.{name}" for name in inspect.signature(Trainer.__init__).parameters if name != "self")


def valid_keys(key: str = "") -> frozenset[str]:
    """The keys ``key`` is compared with (Lightning's arguments only for a trainer key)."""
    keys = static_keys()
    return keys | trainer_arguments() if key.startswith("trainer.") else keys


def may_be_added(key: str) -> bool:
    """Whether ``+key=value`` is the right fix for a key Hydra refused to override: a valid key that the composed
    config lacks (``trainer.enable_checkpointing``), or one of a free-form group (``callbacks.crash.step``)."""
    return key.split(".")[0] in FREE_FORM or key in valid_keys(key)


def _rank(key: str, wrong: str) -> tuple[int, int, int]:
    group = key.split(".")[0] if "." in key else ""
    same = 0 if group == (wrong.split(".")[0] if "." in wrong else "") else 1
    order = PREFERRED.index(group) if group in PREFERRED else len(PREFERRED)
    return same, order, len(key)


def _group_with_option(keys: list[str], value: str | None) -> str | None:
    """The group among ``keys`` that has an option named ``value`` (``modle=tiny``: model, not mode)."""
    return next((key for key in keys if value and (CONF / key / f"{value}.yaml").is_file()), None)


def nearest_key(wrong: str, value: str | None = None) -> str | None:
    """The valid key most like ``wrong`` (difflib): the whole key (``trainer.max_epoch`` -> ``trainer.max_epochs``;
    a group that has ``value`` as an option first), else its last part (``lr`` -> ``model.lr``, ``data.lr`` ->
    ``model.lr``); None when nothing is close."""
    keys = sorted(valid_keys(wrong) - {wrong})
    if group := _group_with_option(difflib.get_close_matches(wrong, keys, n=3, cutoff=0.6), value):
        return group
    if close := difflib.get_close_matches(wrong, keys, n=1, cutoff=0.8):
        return close[0]
    leaf = wrong.rsplit(".", 1)[-1]
    by_leaf: dict[str, list[str]] = {}
    for key in keys:
        by_leaf.setdefault(key.rsplit(".", 1)[-1], []).append(key)
    if close := difflib.get_close_matches(leaf, list(by_leaf), n=1, cutoff=0.75):
        return min(by_leaf[close[0]], key=lambda key: _rank(key, wrong))
    return None


def spelling_hint(wrong: dict[str, str]) -> str:
    """The fix line for unknown keys (key -> the value written): each one's nearest valid key, with its value."""
    pairs = [(key, value, nearest_key(key, value)) for key, value in wrong.items()]
    meant = [f"{near}={value}" if value else near for _, value, near in pairs if near is not None]
    lost = [key for key, _, near in pairs if near is None]
    hint = ""
    if meant:
        hint = f"did you mean {' '.join(meant)}? "
    if lost:
        hint += f"{', '.join(lost)} is like no key of the config: remove it; "
    return hint + "`python train.py --cfg job` prints the composed config and its keys"


def fix_for_refused_key(key: str, value: str) -> str:
    """The fix line when Hydra refuses ``key=value`` (no such key in the composed config): ``+key=value`` for a key
    that may be added (a Lightning argument conf/trainer lacks, a new callback); else the nearest valid key."""
    if may_be_added(key):
        return f"add it with +: +{key}={value} (`python train.py --cfg job` prints the composed config)"
    return spelling_hint({key: value})


errors.unknown_key_fix = fix_for_refused_key
