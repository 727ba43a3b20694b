"""The package's layout rules: floors (a folder imports only the folders below it), no import cycle, no private name
imported from another folder, no oversized module, config targets a reader can find.

These read the source (``ast``) and the YAML files, so they run in well under a second.
"""

from __future__ import annotations

import ast
import importlib
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "gte_pro"
MAX_MODULE_LINES = 300

# The floors of gte_pro, ground first: a module imports its own folder and the folders of lower floors, never a
# folder of its own floor or above. A top-level module (retrieval.py, train.py) is a folder of its own; "" is the
# package's __init__. A new folder needs a line here: deciding its floor is deciding where it sits in the design.
FLOORS: tuple[tuple[str, ...], ...] = (
    ("errors",),  # ground: the exception types of a user's mistakes
    ("utils",),  # files, progress, timing, the distributed check: no models, no data
    ("retrieval", "launch"),  # exact top-k and retrieval sets; processes, checkpoints, resuming, sweeps
    ("data", "models"),  # rows -> batches and stores; the encoder and what shapes it
    ("scoring",),  # a file scored by a teacher, and the teacher judged on its scores (rescoring uses the judge)
    ("evaluation", "mining"),  # metrics and evaluation sets; hard negatives
    # inside trainer.fit; exports of a trained encoder; checking a config and resolving it on this machine
    ("training", "export", "config"),
    ("preflight",),  # the checks and choices before the weights load (memory plan, mini-batch, the batches' lengths)
    ("modes",),  # what a run does (build, fit, evaluate, mine, score)
    ("train", ""),  # the entry train(cfg); the package's config resolvers (lazy imports when Hydra resolves)
)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, also those inside functions (lazy imports are cycles all the same), except under
    ``if TYPE_CHECKING:``, which never runs."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if _type_checking_block(node):
            continue
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        stack.extend(ast.iter_child_nodes(node))


def internal_imports(path: Path, modules: set[str]) -> set[str]:
    """The package's modules that ``path`` imports (``from gte_pro.x import y`` counts ``gte_pro.x.y`` when that is a
    module, else ``gte_pro.x``)."""
    found = set()
    for node in _imports(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            base = node.module or ""
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        found.update(name for name in names if name in modules)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): internal_imports(p, modules) - {module_name(p)} for p in paths}


def folder(module: str) -> str:
    """``gte_pro.data.cache`` -> ``data``; ``gte_pro.retrieval`` -> ``retrieval``; ``gte_pro`` -> ``""``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def floor_of(name: str) -> int:
    return next(i for i, names in enumerate(FLOORS) if name in names)


def upward_imports(graph: Mapping[str, set[str]]) -> list[str]:
    """``a -> b`` for every import of a folder on the same floor or higher (its own folder is fine)."""
    return sorted(f"{a} -> {b}" for a, imported in graph.items() for b in imported
                  if folder(a) != folder(b) and floor_of(folder(b)) >= floor_of(folder(a)))


def private_imports(module: str, source: str, modules: set[str]) -> list[str]:
    """``from gte_pro.x.y import _name`` in ``module`` where ``gte_pro.x.y`` sits in another folder."""
    found = []
    for node in _imports(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("gte_pro"):
            for alias in node.names:
                source_module = f"{node.module}.{alias.name}"
                source_module = source_module if source_module in modules else node.module
                if alias.name.startswith("_") and folder(source_module) != folder(module):
                    found.append(f"{module}: {node.module}.{alias.name}")
    return found


def find_cycle(graph: Mapping[str, set[str]]) -> list[str] | None:
    """One import cycle as a path [a, b, ..., a], or None (depth-first search with colours)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for child in sorted(graph.get(node, ())):
            if state.get(child) == 1:
                return path[path.index(child):] + [child]
            if child not in state and (cycle := visit(child)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (cycle := visit(start)):
            return cycle
    return None


def test_cycle_finder_finds_a_cycle_and_accepts_a_tree():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_lazy_import_counts_as_an_edge(tmp_path: Path):
    source = tmp_path / "m.py"
    source.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import gte_pro.hidden\n"
                      "def f():\n    from gte_pro.data import records\n")
    assert internal_imports(source, {"gte_pro.data", "gte_pro.data.records", "gte_pro.hidden"}) == {
        "gte_pro.data.records"}


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert "gte_pro.modes.build" in graph["gte_pro.modes.fit"]  # the graph is real: fit builds through the builders
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_every_folder_has_a_floor():
    folders = {folder(module) for module in import_graph()}
    assert all(len(names) == len(set(names)) for names in FLOORS)
    unplaced = sorted(f for f in folders if not any(f in names for names in FLOORS))
    assert not unplaced, f"give these folders a floor in FLOORS: {unplaced}"


def test_the_floor_rule_catches_upward_and_sideways_imports():
    graph = {"gte_pro.data.base": {"gte_pro.data.cache", "gte_pro.retrieval", "gte_pro.modes.fit"},
             "gte_pro.evaluation.sets": {"gte_pro.mining.core", "gte_pro.data.base"}}
    assert upward_imports(graph) == ["gte_pro.data.base -> gte_pro.modes.fit",
                                     "gte_pro.evaluation.sets -> gte_pro.mining.core"]


def test_no_folder_imports_its_own_floor_or_above():
    graph = import_graph()
    assert "gte_pro.retrieval" in graph["gte_pro.data.base"]  # the graph is real: data builds retrieval sets
    upward = upward_imports(graph)
    assert not upward, "imports from the same floor or above (see FLOORS):\n" + "\n".join(upward)


def test_the_private_name_finder_sees_a_cross_folder_import():
    source = "from gte_pro.evaluation.metrics import _hidden, shown\nfrom gte_pro.mining.core import _own\n"
    assert private_imports("gte_pro.mining.embed", source, {"gte_pro.evaluation.metrics", "gte_pro.mining.core"}) == [
        "gte_pro.mining.embed: gte_pro.evaluation.metrics._hidden"]


def test_no_private_name_is_imported_from_another_folder():
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    found = [hit for path in paths for hit in private_imports(module_name(path), path.read_text(), modules)]
    assert not found, "private names imported across folders (make them public where they belong):\n" + \
        "\n".join(found)


# A data module is handed its collaborators (negative pools, pair joiners, candidates, eval sets: the protocols of
# gte_pro/data/collaborators.py) when it is built; no module outside gte_pro/data writes into it afterwards. A data
# module is a name or attribute called *datamodule*/*data_module* (``dm``), a name annotated with a *DataModule type,
# or a name bound to a call that builds one (build_datamodule, build_data_for, eval_datamodule, data_module,
# datamodule_of, *DataModule(...)).
# A write is an assignment (also augmented or annotated) to one of its attributes or items, ``setattr`` on it, or a
# call of one of its ``add_*``/``set_*``/``attach_*`` methods.
_DATA_MODULE_WORDS = ("datamodule", "data_module")
_DATA_MODULE_BUILDERS = ("build_datamodule", "build_data_for", "eval_datamodule", "data_module", "datamodule_of")
_MUTATING_PREFIXES = ("add_", "set_", "attach_")


def _names_a_data_module(node: ast.AST, bound: set[str]) -> bool:
    if isinstance(node, ast.Name):
        return node.id in bound or node.id == "dm" or any(w in node.id.lower() for w in _DATA_MODULE_WORDS)
    if isinstance(node, ast.Attribute):  # dm.__dict__["x"] = ... writes into dm
        return any(w in node.attr.lower() for w in _DATA_MODULE_WORDS) or (
            node.attr == "__dict__" and _names_a_data_module(node.value, bound))
    if isinstance(node, ast.Call) and ast.unparse(node.func) == "vars" and node.args:  # vars(dm)["x"] = ...
        return _names_a_data_module(node.args[0], bound)
    return False


def _bound_data_modules(tree: ast.AST) -> set[str]:
    """Names annotated with a data module type or bound to a call that builds one (anywhere in the module)."""
    bound = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            name = node.arg if isinstance(node, ast.arg) else ast.unparse(node.target)
            if "DataModule" in ast.unparse(node.annotation):
                bound.add(name)
        if isinstance(node, ast.Assign | ast.AnnAssign) and isinstance(node.value, ast.Call):
            called = ast.unparse(node.value.func).rpartition(".")[2]
            if called in _DATA_MODULE_BUILDERS or called.endswith("DataModule"):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                bound.update(t.id for t in targets if isinstance(t, ast.Name))
    return bound


def data_module_writes(module: str, source: str) -> list[str]:
    """``module:line: statement`` for every write into a data module in ``source`` (see the rule above)."""
    tree = ast.parse(source)
    bound = _bound_data_modules(tree)
    found = []
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [t for target in node.targets
                       for t in (target.elts if isinstance(target, ast.Tuple | ast.List) else [target])]
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        written = any(isinstance(t, ast.Attribute | ast.Subscript) and _names_a_data_module(t.value, bound)
                      for t in targets)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr":
            written = bool(node.args) and _names_a_data_module(node.args[0], bound)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            written = node.func.attr.startswith(_MUTATING_PREFIXES) and _names_a_data_module(node.func.value, bound)
        if written:
            found.append((node.lineno, f"{module}:{node.lineno}: {ast.unparse(node).splitlines()[0]}"))
    return [hit for _, hit in sorted(found)]


def test_the_data_module_write_finder_sees_every_kind_of_write():
    source = """
def setup(self, trainer, dm, source: ContrastiveDataModule):
    trainer.datamodule.negative_pool = self.pool
    datamodule = trainer.datamodule
    datamodule.candidates = self.candidates
    run.data_module.x += 1
    dm.y: int = 2
    setattr(dm, "z", 3)
    source.pair_join = join
    built = build_data_for(cfg, module)
    built.extra = []
    datamodule.__dict__["w"] = 4; vars(dm)["v"] = 5
    datamodule.add_eval_sets(sets)
    a, trainer.datamodule.b = 1, 2
    # reads, and writes into other objects, are fine
    self.pool = datamodule.negative_pool
    trainer.x = datamodule.validation_sets()
    datamodule.setup("fit")
"""
    assert [hit.split(":")[1] for hit in data_module_writes("m", source)] == [
        str(line) for line in (3, 5, 6, 7, 8, 9, 11, 12, 12, 13, 14)]


def test_the_rule_catches_the_old_run_time_writes():
    """The writes this rule was written against (before the data module took its collaborators when built)."""
    old = {"gte_pro.mining.remine": "datamodule = trainer.datamodule\ndatamodule.negative_pool = self.pool\n",
           "gte_pro.modes.build": "datamodule = build_datamodule(cfg, t)\ndatamodule.pair_join = model.pairs\n",
           "gte_pro.training.rerank_module": "datamodule = self.trainer.datamodule\n"
                                             "datamodule.candidates = self.candidates\n",
           "gte_pro.evaluation.sets": "def attach_eval_sets(datamodule: Any, cfg: Any) -> None:\n"
                                      "    datamodule.add_eval_sets(sets, batch_size=1)\n"}
    assert [hit for module, source in old.items() for hit in data_module_writes(module, source)] == [
        "gte_pro.mining.remine:2: datamodule.negative_pool = self.pool",
        "gte_pro.modes.build:2: datamodule.pair_join = model.pairs",
        "gte_pro.training.rerank_module:2: datamodule.candidates = self.candidates",
        "gte_pro.evaluation.sets:2: datamodule.add_eval_sets(sets, batch_size=1)"]


def test_no_module_outside_data_writes_into_a_data_module():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if folder(module_name(p)) != "data"]
    found = [hit for path in paths for hit in data_module_writes(module_name(path), path.read_text())]
    assert not found, ("writes into a data module from outside gte_pro/data (hand it the collaborator when it is "
                       "built: gte_pro/data/collaborators.py):\n" + "\n".join(found))


# A data module's private methods and attributes (``_cache_folder``, ``_ensure_cache``, ...) are the data package's
# own: other floors use its public interface (``open_token_cache``, ``train_sampler``, ...). Data modules are built in
# gte_pro/modes (and gte_pro/data) only: the pre-flight reads the run's one data module, it never builds a second.
_DATA_MODULE_BUILDING = (*_DATA_MODULE_BUILDERS, "build_data_before_model")
DATA_MODULE_BUILDERS_AT = ("data", "modes")


def data_module_private_uses(module: str, source: str) -> list[str]:
    """``module:line: expression`` for every ``<data module>._name`` (a call or a read) in ``source``."""
    tree = ast.parse(source)
    bound = _bound_data_modules(tree)
    found = sorted({(node.lineno, f"{module}:{node.lineno}: {ast.unparse(node)}") for node in ast.walk(tree)
                    if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                    and _names_a_data_module(node.value, bound)})
    return [hit for _, hit in found]


def data_module_builds(module: str, source: str) -> list[str]:
    """``module:line: call`` for every call that builds a data module (a builder, or a ``*DataModule(...)``)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = ast.unparse(node.func).rpartition(".")[2]
            if called in _DATA_MODULE_BUILDING or called.endswith("DataModule"):
                found.append((node.lineno, f"{module}:{node.lineno}: {ast.unparse(node).splitlines()[0]}"))
    return [hit for _, hit in sorted(found)]


def test_the_rules_catch_the_second_data_module_of_the_old_memory_plan():
    """gte_pro/training/data_lengths.py before the pre-flight read the run's own data module (issue 42)."""
    old = """
def data_lengths(cfg, cuda):
    datamodule = build_datamodule(cfg, tokenizer, eval_sets=eval_set_source(cfg))
    if not isinstance(datamodule, ContrastiveDataModule) or datamodule._cache_folder() is None:
        return None
    cache = datamodule.open_token_cache()
    return cfg.trainer.datamodule._ensure_cache(), datamodule.seed
"""
    assert data_module_private_uses("gte_pro.training.data_lengths", old) == [
        "gte_pro.training.data_lengths:4: datamodule._cache_folder",
        "gte_pro.training.data_lengths:7: cfg.trainer.datamodule._ensure_cache"]
    assert data_module_builds("gte_pro.training.data_lengths", old) == [
        "gte_pro.training.data_lengths:3: build_datamodule(cfg, tokenizer, eval_sets=eval_set_source(cfg))"]
    assert data_module_builds("m", "x = JsonlDataModule(train_file=f)\ny = data.build_data_for(cfg, m)\n") == [
        "m:1: JsonlDataModule(train_file=f)", "m:2: data.build_data_for(cfg, m)"]


def test_no_module_outside_data_uses_a_data_modules_private_names():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if folder(module_name(p)) != "data"]
    found = [hit for path in paths for hit in data_module_private_uses(module_name(path), path.read_text())]
    assert not found, "a data module's private names used outside gte_pro/data (use or add a public method):\n" + \
        "\n".join(found)


def test_data_modules_are_built_in_modes_only():
    paths = [p for p in sorted(PACKAGE.rglob("*.py")) if folder(module_name(p)) not in DATA_MODULE_BUILDERS_AT]
    found = [hit for path in paths for hit in data_module_builds(module_name(path), path.read_text())]
    assert not found, ("data modules built outside gte_pro/modes (the pre-flight reads the run's own: "
                       "gte_pro/modes/prepare.py):\n" + "\n".join(found))


def test_no_module_is_oversized():
    sizes = {module_name(p): len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")}
    too_long = {name: n for name, n in sizes.items() if n > MAX_MODULE_LINES}
    assert not too_long, f"split these modules by job (over {MAX_MODULE_LINES} lines): {too_long}"


def _targets(node: object, key: str = "") -> Iterator[tuple[str, str]]:
    """(key the node sits under, _target_) for every node of a config file."""
    if isinstance(node, dict):
        if isinstance(node.get("_target_"), str):
            yield key, node["_target_"]
        for child_key, child in node.items():
            yield from _targets(child, str(child_key))
    elif isinstance(node, list):
        for child in node:
            yield from _targets(child, key)


def _config_targets() -> list[tuple[str, str, str, str]]:
    """(config file, group, option, key, target) for every target of our own code."""
    found = []
    for path in sorted((ROOT / "conf").rglob("*.yaml")):
        relative = path.relative_to(ROOT / "conf")
        group = relative.parent.name or relative.stem
        for key, target in _targets(yaml.safe_load(path.read_text()) or {}):
            if target.split(".")[0] in ("gte_pro", "hydra_plugins"):
                found.append((str(relative), group, relative.stem, key, target))
    return found


@pytest.mark.parametrize(("config", "group", "option", "key", "target"), _config_targets())
def test_config_target_lives_where_its_group_or_option_says(config, group, option, key, target):
    # the longest importable prefix is the module; the rest an attribute path (a class, or a builder on it such as
    # gte_pro.models.encoder.Encoder.load)
    names = target.split(".")
    module_path, found = "", None
    for cut in range(len(names) - 1, 0, -1):
        try:
            module_path, found = ".".join(names[:cut]), importlib.import_module(".".join(names[:cut]))
            break
        except ModuleNotFoundError:
            continue
    for attribute in names[cut:]:
        found = getattr(found, attribute, None)
    assert found is not None, f"{config}: {target} does not exist"
    words = {w for w in (group, option, key) if w and w not in ("default",)}
    parts = module_path.split(".")[1:]
    # conf/data/hf.yaml -> gte_pro.data.hf; conf/loss/gte.yaml -> gte_pro.training.losses;
    # hydra callbacks.sweep -> launch.sweep
    assert any(p.startswith(w) or w.startswith(p) for p in parts for w in words), (
        f"{config}: target {target} is not in a module named after its group, option or key ({sorted(words)})")


def test_every_config_group_with_our_code_is_checked():
    groups = {group for _, group, _, _, _ in _config_targets()}
    assert {"data", "loss", "model", "callbacks", "hydra", "launcher"} <= groups
