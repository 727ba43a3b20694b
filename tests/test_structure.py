"""The package's layout rules: no import cycle, no oversized module, config targets a reader can find.

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
    module_path, _, attribute = target.rpartition(".")
    assert hasattr(importlib.import_module(module_path), attribute), f"{config}: {target} does not exist"
    words = {w for w in (group, option, key) if w and w not in ("default",)}
    parts = module_path.split(".")[1:]
    # conf/data/hf.yaml -> gte_pro.data.hf; conf/loss/gte.yaml -> gte_pro.training.losses;
    # hydra callbacks.sweep -> launch.sweep
    assert any(p.startswith(w) or w.startswith(p) for p in parts for w in words), (
        f"{config}: target {target} is not in a module named after its group, option or key ({sorted(words)})")


def test_every_config_group_with_our_code_is_checked():
    groups = {group for _, group, _, _, _ in _config_targets()}
    assert {"data", "loss", "model", "callbacks", "hydra", "launcher"} <= groups
