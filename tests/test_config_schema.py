"""One source per key: the schemas (gte_pro/config/schema/) against the code they configure and the YAML files.

Each schema field is a parameter of its group's ``_target_`` (and each parameter a field), every default a
constructor keeps for direct use equals the schema's, conf/train.yaml and conf/trainer/default.yaml hold the
defaults that RunSchema and TrainerSchema state, and docs/configuration.md's tables are the ones the schemas make.
These read signatures and files: no model is built.
"""

from __future__ import annotations

import ast
import inspect
from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml
from hydra.utils import get_object

from gte_pro.config.checks import schema_fields
from gte_pro.config.schema import SCHEMAS
from gte_pro.config.schema.data import DataCommon
from gte_pro.config.schema.run import RunSchema, TrainerSchema

ROOT = Path(__file__).resolve().parents[1]
# a data option's _target_ is its row source (gte_pro.data.sources), which takes the option's own keys; the keys every
# source shares (DataCommon) are read by the data module's parts as gte_pro/modes/build_data.py builds them
OWN_KEYS_ONLY = {"data": DataCommon}
# data=mix's own keys that its Mixing does not take: the sources are built one data module each
MIX_OWN_READ = ("sources",)
TARGETED = [(group, option, schema) for group in ("data", "model", "loss")
            for option, schema in SCHEMAS[group].items()]


def _keywords(params: list[inspect.Parameter]) -> dict[str, inspect.Parameter]:
    return {p.name: p for p in params
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in ("self", "cls")}


def _parameters(target: str) -> dict[str, inspect.Parameter]:
    """The keyword parameters of ``target``: a builder's (a function or classmethod, e.g. the models'
    ``Encoder.load``), or a class's constructor's, following ``**kwargs`` up its bases."""
    built = get_object(target)
    if not inspect.isclass(built):
        params = list(inspect.signature(built).parameters.values())
        assert not any(p.kind == p.VAR_KEYWORD for p in params), f"{target} takes **kwargs: its keys cannot be read"
        return _keywords(params)
    found: dict[str, inspect.Parameter] = {}
    for klass in inspect.getmro(built):
        if "__init__" not in vars(klass) or klass is object:
            continue
        params = list(inspect.signature(klass.__init__).parameters.values())
        for name, param in _keywords(params).items():
            found.setdefault(name, param)
        if not any(p.kind == p.VAR_KEYWORD for p in params):
            break
    return found


def _arguments(schema: type) -> dict[str, object]:
    """name -> default of the schema's top-level fields its target takes."""
    out = {}
    for item in fields(schema):
        if item.name == "_target_" or not item.metadata.get("argument", True):
            continue
        default = item.default if item.default is not MISSING else item.default_factory()
        out[item.name] = default
    return out


@pytest.mark.parametrize(("group", "option", "schema"), TARGETED, ids=[f"{g}/{o}" for g, o, _ in TARGETED])
def test_schema_fields_are_the_targets_parameters(group, option, schema):
    target = schema.__dataclass_fields__["_target_"].default
    written = yaml.safe_load((ROOT / "conf" / group / f"{option}.yaml").read_text())
    assert written.get("_target_", target) == target, f"conf/{group}/{option}.yaml names another _target_"
    params = _parameters(target)
    arguments = set(_arguments(schema))
    if group in OWN_KEYS_ONLY:
        arguments -= set(_arguments(OWN_KEYS_ONLY[group])) | set(MIX_OWN_READ) if option == "mix" else set(
            _arguments(OWN_KEYS_ONLY[group]))
    assert arguments == set(params), (
        f"{schema.__name__} vs {target}: only in the schema {sorted(arguments - set(params))}, "
        f"only in the code {sorted(set(params) - arguments)}")


def _keys_read(path: Path) -> set[str]:
    """The string keys ``settings[...]`` / ``shared[...]`` / ``merged[...]`` subscripts and ``.get(...)`` calls read
    in ``path``."""
    keys = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(
                node.value, ast.Name) and node.value.id in ("settings", "shared", "merged"):
            keys.add(node.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" and (
                isinstance(node.func.value, ast.Name) and node.func.value.id == "settings") and node.args and (
                isinstance(node.args[0], ast.Constant)):
            keys.add(node.args[0].value)
    return keys


def test_every_data_key_is_read_by_a_part_of_the_data_module():
    """The keys every source shares are read where the data module's parts are built (or named as read elsewhere);
    a data=mix's own keys beyond its Mixing's too: a schema key that nothing reads would be silently ignored."""
    from gte_pro.modes.build_data import READ_ELSEWHERE

    read = _keys_read(ROOT / "gte_pro" / "modes" / "build_data.py")
    shared = set(_arguments(DataCommon)) - READ_ELSEWHERE
    assert shared <= read, f"DataCommon keys no part reads: {sorted(shared - read)}"
    assert set(MIX_OWN_READ) <= read
    assert read <= shared | set(MIX_OWN_READ) | {"_target_", "query_prefix", "doc_prefix", "seed"}, (
        f"keys read that no schema states: {sorted(read - shared - set(MIX_OWN_READ))}")


def test_no_part_of_a_data_module_keeps_a_default_of_its_own():
    """The schemas are the only defaults of data.* (gte_pro/modes/build_data.py): no part's constructor restates
    one."""
    from gte_pro.data.base import ContrastiveDataModule
    from gte_pro.data.batching import Batching, LoaderOptions
    from gte_pro.data.mix import MixDataModule, Mixing
    from gte_pro.data.sources import RowSource
    from gte_pro.data.token_cache import Decontamination, TokenCache, Tokenization
    from gte_pro.data.validation import Validation

    parts = [ContrastiveDataModule, MixDataModule, Mixing, Batching, LoaderOptions, TokenCache, Tokenization,
             Decontamination, Validation, *RowSource.__subclasses__()]
    assert len(RowSource.__subclasses__()) >= 4
    defaults = [f"{part.__name__}({name}={param.default!r})" for part in parts
                for name, param in inspect.signature(part.__init__).parameters.items()
                if param.default is not inspect.Parameter.empty]
    assert not defaults, f"defaults restated outside the schemas: {defaults}"


@pytest.mark.parametrize("option", sorted(SCHEMAS["loss"]))
def test_no_loss_keeps_a_default_of_its_own(option):
    """A loss takes every key of its schema (conf/loss/<option>.yaml) by keyword and states no default:
    ``gte_pro.config.defaults.default_loss`` builds one with the schema's for use without a config."""
    target = SCHEMAS["loss"][option].__dataclass_fields__["_target_"].default
    defaults = {name: param.default for name, param in _parameters(target).items()
                if param.default is not inspect.Parameter.empty}
    assert not defaults, f"{target} restates defaults of its schema: {defaults}"


@pytest.mark.parametrize(("group", "option", "schema"), TARGETED, ids=[f"{g}/{o}" for g, o, _ in TARGETED])
def test_a_constructor_default_is_the_schemas(group, option, schema):
    """A default the code keeps (for use without a config) must be the schema's, or the two runs differ."""
    target = schema.__dataclass_fields__["_target_"].default
    params = _parameters(target)
    for name, default in _arguments(schema).items():
        # a data option's shared keys: no part keeps a default (test_no_part_of_a_data_module_keeps_a_default...)
        param = params.get(name)
        unset = param is None or param.default is inspect.Parameter.empty
        if unset or isinstance(default, str) and default.startswith(("${", "???")):
            continue
        expected = default if not hasattr(default, "__dataclass_fields__") else None
        if isinstance(param.default, tuple):
            expected = tuple(expected)
        if expected is None and param.default is None:
            continue
        assert param.default == expected or (param.default is None and default in ([], None)), (
            f"{target}({name}=...) defaults to {param.default!r}; {schema.__name__}.{name} is {default!r}")


def test_every_setting_has_a_meaning_and_known_rule_kind():
    every = [*[s for options in SCHEMAS.values() for s in options.values()], RunSchema, TrainerSchema]
    for schema in every:
        for key, item in schema_fields(schema):
            assert item.metadata.get("doc"), f"{schema.__name__}.{key} has no one-line meaning"


@pytest.mark.parametrize(("path", "schema"), [("train.yaml", RunSchema), ("trainer/default.yaml", TrainerSchema)])
def test_yaml_values_are_the_schemas_defaults(path, schema):
    written = yaml.safe_load((ROOT / "conf" / path).read_text())
    if schema is RunSchema:  # `task` is set by the default option of the task/ group
        written.update(yaml.safe_load((ROOT / "conf" / "task" / "embed.yaml").read_text()))
    for key, item in schema_fields(schema):
        assert key in written, f"conf/{path} lacks {key}, which {schema.__name__} states"
        assert written[key] == item.default, f"conf/{path}: {key}={written[key]!r}, {schema.__name__}: {item.default!r}"


def test_the_manuals_option_tables_are_the_schemas():
    from gte_pro.config.tables import main

    assert main(["--check"]) == 0, "docs/configuration.md drifted from the schemas: python -m gte_pro.config.tables"


# reads of a checkpoint's saved config parts, from before the key existed: the default there must be the schema's
# (the floor of gte_pro.training is below the schemas', so it cannot read them)
OLD_CHECKPOINT_READS = {("gte_pro/training/module.py", "telemetry_every_n_steps"): "eval",
                        ("gte_pro/training/rerank_module.py", "rerank_depth"): "eval"}
NOT_CONFIG_READS = {("gte_pro/export/card.py", "num_negatives")}  # the run's summary (what the data carried)


def _schema_defaults() -> dict[str, dict[str, object]]:
    """key -> {schema name: its default} over every schema (groups and the top level)."""
    found: dict[str, dict[str, object]] = {}
    for schema in [*[s for options in SCHEMAS.values() for s in options.values()], RunSchema, TrainerSchema]:
        for item in fields(schema):
            default = item.default if item.default is not MISSING else item.default_factory()
            found.setdefault(item.name, {})[schema.__name__] = default
    return found


def _fallback_reads() -> list[tuple[str, int, str, str]]:
    """(file, line, key, the call) of each ``x.get("<a schema key or group>", <fallback>)`` and
    ``OmegaConf.select(cfg, "<key>", default=<not None>)`` in gte_pro outside gte_pro/config/."""
    keys = set(_schema_defaults()) | set(SCHEMAS) | {"trainer", "strategy", "paths", "callbacks", "logger"}
    found = []
    for path in sorted((ROOT / "gte_pro").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        if name.startswith("gte_pro/config/"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr == "get" and len(node.args) == 2 and isinstance(node.args[0], ast.Constant):
                key = node.args[0].value
                if key in keys:
                    found.append((name, node.lineno, key, ast.unparse(node)))
            elif node.func.attr == "select" and len(node.args) == 2 and isinstance(node.args[1], ast.Constant):
                default = next((k.value for k in node.keywords if k.arg == "default"), None)
                if default is not None and not (isinstance(default, ast.Constant) and default.value is None):
                    found.append((name, node.lineno, str(node.args[1].value).rsplit(".", 1)[-1], ast.unparse(node)))
    return found


def test_no_read_of_the_config_restates_a_default():
    """A config read with a fallback (``cfg.get("resume", "auto")``) states the key's default a second time, where
    nothing holds it equal to the schema's: a composed config has every key, so the code reads it as it is."""
    restated = [f"{name}:{line}: {call}" for name, line, key, call in _fallback_reads()
                if (name, key) not in OLD_CHECKPOINT_READS and (name, key) not in NOT_CONFIG_READS]
    assert not restated, "config reads with a fallback default (read the key itself):\n" + "\n".join(restated)


def test_an_old_checkpoints_fallback_is_the_schemas_default():
    defaults = _schema_defaults()
    reads = {(name, key): call for name, _, key, call in _fallback_reads()}
    for (name, key), schema_group in OLD_CHECKPOINT_READS.items():
        assert (name, key) in reads, f"{name} no longer reads {key} with a fallback: drop it from OLD_CHECKPOINT_READS"
        fallback = ast.literal_eval(ast.parse(reads[name, key]).body[0].value.args[1])
        schema = SCHEMAS[schema_group]["default"].__name__
        assert fallback == defaults[key][schema], f"{name}: {key} falls back to {fallback!r}, {schema} says " \
                                                  f"{defaults[key][schema]!r}"
