"""benchmarks/ as a whole: no file over 300 lines, every ``make bench*`` name (README, docs/, the Makefile's comments)
reaching a script through the Makefile's one pattern rule, every name a script takes from harness/ or a sibling
defined there, and the shared options, rounds and machine line of harness/. Nothing is measured; no make runs."""

from __future__ import annotations

import ast
import importlib.util
import random
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

BENCH = REPO / "benchmarks"
MAX_LINES = 300
MAKE_NAME = re.compile(r"\bmake (bench(?:-[a-z0-9]+)*)\b")
sys.path.insert(0, str(BENCH))  # the benchmark scripts import their siblings and harness/

import harness  # noqa: E402


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _python_files() -> list[Path]:
    return sorted(BENCH.rglob("*.py"))


def test_no_file_in_benchmarks_is_over_300_lines():
    files = _python_files()
    assert len(files) > 10 and BENCH / "harness" / "__init__.py" in files
    long = {str(f.relative_to(REPO)): n for f in files if (n := len(f.read_text().splitlines())) > MAX_LINES}
    assert not long, f"over {MAX_LINES} lines: {long}"


def _make_rules() -> tuple[dict[str, str], str]:
    """(``bench*`` target -> its one prerequisite, for the explicit aliases; the pattern rule's recipe)."""
    lines = (REPO / "Makefile").read_text().splitlines()
    aliases, recipe = {}, []
    for i, line in enumerate(lines):
        if line.startswith("bench-%:"):
            for following in lines[i + 1:]:  # the recipe: the tab-indented lines after the rule
                if not following.startswith("\t"):
                    break
                recipe.append(following)
        elif rule := re.match(r"^(bench[\w-]*):\s*(\S+)\s*$", line):
            aliases[rule.group(1)] = rule.group(2)
    assert recipe, "no `bench-%:` pattern rule in the Makefile"
    return aliases, "\n".join(recipe)


def _script_of(name: str, aliases: dict[str, str], recipe: str) -> Path:
    """What ``make NAME`` runs, as make would expand the pattern rule's ``benchmarks/...py``."""
    seen = set()
    while name in aliases and name not in seen:  # an explicit rule (``bench: bench-train``) wins over the pattern
        seen.add(name)
        name = aliases[name]
    assert name.startswith("bench-"), f"make {name}: neither an alias nor matched by bench-%"
    stem = name[len("bench-"):]
    run = next(line for line in recipe.splitlines() if "$(PY)" in line)
    script = re.search(r"benchmarks/.*?\.py", run).group(0)
    return REPO / script.replace("$(subst -,_,$*)", stem.replace("-", "_")).replace("$*", stem)


def test_every_make_bench_name_runs_an_existing_script():
    aliases, recipe = _make_rules()
    makefile_comments = "\n".join(ln for ln in (REPO / "Makefile").read_text().splitlines() if ln.startswith("#"))
    docs = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]  # where the commands are documented
    names = {name for text in [makefile_comments, *(d.read_text() for d in docs if d.is_file())]
             for name in MAKE_NAME.findall(text)}
    assert {"bench", "bench-gpu", "bench-eval-memory"} <= names
    missing = {name: str(path) for name in sorted(names) if not (path := _script_of(name, aliases, recipe)).is_file()}
    assert not missing, f"make targets without their script: {missing}"
    assert _script_of("bench", aliases, recipe) == BENCH / "bench_train.py"
    # and the other way: every benchmark is described in the Makefile's comment block, by its make name
    documented = {_script_of(n, aliases, recipe) for n in re.findall(r"^# (bench[\w-]*)[:,]", makefile_comments, re.M)}
    assert set(BENCH.glob("bench_*.py")) <= documented


def _defined(path: Path) -> set[str]:
    """The top-level names a module defines or imports (what ``from module import name`` can take)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names |= {alias.asname or alias.name.split(".")[0] for alias in node.names}
    return names


@pytest.mark.parametrize("path", sorted(BENCH.glob("*.py")), ids=lambda p: p.name)
def test_every_name_taken_from_harness_or_a_sibling_exists(path: Path):
    tree = ast.parse(path.read_text())
    siblings = {p.stem for p in BENCH.glob("*.py")}
    wanted: list[tuple[str, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            top = node.module.split(".")[0]
            if top == "harness" or top in siblings:
                wanted += [(node.module, alias.name) for alias in node.names]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "harness":
            wanted.append(("harness", node.attr))
    for module, name in wanted:
        if module == "harness" or module.startswith("harness."):
            assert hasattr(sys.modules.get(module) or harness, name), f"{path.name}: {module}.{name} does not exist"
        else:
            assert name in _defined(BENCH / f"{module}.py"), f"{path.name}: {module}.{name} does not exist"


def test_common_options_have_one_name_and_meaning():
    parser = harness.add_common(harness.parser("doc"), batch_size=8, max_length=16, rounds=2, timeout=5,
                                timeout_of="row", cache_dir=True, workdir="/tmp/w")
    args = parser.parse_args(["--json", "out.json"])
    assert (args.batch_size, args.max_length, args.rounds, args.timeout, args.workdir) == (8, 16, 2, 5, "/tmp/w")
    assert args.json == "out.json" and args.cache_dir == harness.CACHE_DIR
    bare = harness.add_common(harness.parser("doc"), timeout_of=None).parse_args([])
    assert vars(bare) == {"json": None}
    assert harness.int_list("10000, 200000,") == [10000, 200000]


@pytest.mark.parametrize("name", ["bench_train", "bench_gpu", "bench_scale", "bench_eval_memory", "bench_negatives",
                                  "bench_options", "bench_teachers"])
def test_scripts_take_the_common_options(name: str):
    args = _load(name).parse_args(["--json", "r.json", "--timeout", "7"])
    assert args.json == "r.json" and args.timeout == 7.0


@pytest.mark.parametrize("name", ["bench_negatives", "bench_options", "bench_teachers"])
def test_dry_run_prints_the_train_py_commands(name: str, tmp_path: Path, capsys: pytest.CaptureFixture):
    _load(name).main(["--dry-run", "--workdir", str(tmp_path), "--seeds", "1,2"])
    out = capsys.readouterr().out
    assert out.startswith("commands (in this order):") and "seed=2" in out and " train.py mode=eval " in out
    assert not list(tmp_path.iterdir()) and "raw results" not in out  # nothing built, run or written


def test_teacher_pipelines_add_the_one_off_steps_they_need(tmp_path: Path, capsys: pytest.CaptureFixture):
    bench = _load("bench_teachers")
    args = bench.parse_args(["--workdir", str(tmp_path), "--seeds", "1,2", "--variants", "mined,distill,inbatch"])
    steps = {"mine": {"wall_s": 10.0}, "reranker": {"wall_s": 100.0, "ndcg": 0.8, "retriever_ndcg": 0.6},
             "score": {"wall_s": 5.0}}
    rows = [{"variant": v, "seed": s, "ndcg": n, "wall_s": 50.0}
            for v, s, n in (("mined", 1, 0.60), ("mined", 2, 0.62), ("distill", 1, 0.70), ("distill", 2, 0.71),
                            ("inbatch", 1, 0.5), ("inbatch", 2, 0.5))]
    table = {row["variant"]: row for row in bench.summarize(rows, args, steps)}
    assert table["inbatch"]["pipeline_s"] == 50.0 and table["mined"]["pipeline_s"] == 60.0
    assert table["distill"]["pipeline_s"] == 50.0 + 10 + 100 + 5
    lines = bench.verdict(list(table.values()), steps)
    assert lines[0].startswith("reranker: NDCG@10 0.8000") and "above the embedder" in lines[0]
    assert "+0.0950 NDCG@10 over mined" in lines[1] and "beats mined InfoNCE by more than the spread" in lines[1]
    # the one-off commands feed each other: mined.jsonl -> the reranker -> its export scores mined.jsonl
    commands = bench.step_commands(args, tmp_path / "set")
    assert f"data.train_file={tmp_path / 'mined.jsonl'}" in commands["reranker"]
    assert f"score.teacher={tmp_path / 'runs' / 'reranker' / 'model'}" in commands["score"]
    assert "task=rerank" in commands["reranker"] and "mine.relative_margin=null" in commands["rescore"]


def test_timed_rounds_interleave_and_median_rows():
    calls = []

    def variant(name: str, fail: bool = False):
        def run():
            calls.append(name)
            if fail:
                raise RuntimeError("lost")
            return name.upper()
        return run

    runs, outputs = harness.timed_rounds({"a": variant("a"), "b": variant("b", fail=True)}, 3,
                                         lambda out: {"size": float(len(out))})
    assert calls == ["a", "b"] * 3 and outputs == {"a": "A"}
    assert all(r["seconds"] >= 0 and r["cpu_s"] >= 0 and r["size"] == 1.0 for r in runs["a"])
    assert runs["b"] == [{"error": "RuntimeError: lost"}] * 3
    row = harness.median_row("a", runs["a"], ["seconds", "size"])
    assert row["variant"] == "a" and row["size"] == 1.0 and "seconds" in row
    assert harness.median_row("b", runs["b"], ["seconds"]) == {"variant": "b", "error": "RuntimeError: lost"}
    assert harness.median_row("c", [], ["seconds"], label="size") == {"size": "c", "error": "did not run"}


def test_machine_line_names_the_cpu_its_capability_and_the_date():
    line = harness.machine()
    model, flags = harness.cpu_model()
    assert line.startswith(model) and "CPU capability " in line and "torch threads" in line and "CUDA: " in line
    assert re.search(r"; \d{4}-\d\d-\d\d \d\d:\d\d UTC$", line)
    assert ("bf16 in hardware: none" in line) == (not {"avx512_bf16", "amx_bf16"} & flags)


def test_synthetic_words_are_deterministic():
    assert harness.words(random.Random(3), 5) == harness.words(random.Random(3), 5)
    assert len(set(harness.words(random.Random(3), 200))) > 100
