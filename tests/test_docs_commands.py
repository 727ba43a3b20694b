"""Docs that cannot rot: every ``python train.py ...`` line of README.md and docs/*.md composes through Hydra.

The lines are collected from code blocks (fenced and indented, ``\\`` continuations joined) and from inline code,
including ``make train ARGS="..."`` and ``torchrun ... train.py ...``. Each is composed in-process with Hydra's
compose API, as ``python train.py`` would compose it (no training, no subprocess), then checked with the run's own
``check_config``: a renamed key, a removed option or a wrong value in the docs fails here.

Placeholder policy: ``<...>`` placeholders (``<run>``, ``<run dir>``, ``<folder>``) become a real path and
``$PWD`` a real folder (composing reads no file). A bare ``...`` token ("and the rest, as above") is dropped; such a
line may then leave a required key unset (``data.train_file=???``), which is the only problem tolerated for it.
A line that cannot be composed at all is skipped only when listed in ``SKIPPED`` with its reason.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import ConfigCompositionException
from hydra.types import RunMode
from omegaconf import DictConfig, open_dict

from gte_pro.config.checks import config_problems
from gte_pro.config.cross_keys import launcher_problems
from tests.conftest import CONF, REPO

DOC_FILES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]

# command line (after placeholder substitution) -> why it is not composed; keep this list empty where possible
SKIPPED: dict[str, str] = {}

# Hydra's command-line flags: those that take a value, and those that do not (neither is an override)
FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp", "--config-name", "-cn",
                    "--config-dir", "-cd", "--experimental-rerun"}
FLAGS = {"-m", "--multirun", "--resolve", "--run", "-r", "--help", "-h", "--hydra-help", "--version",
         "--shell-completion", "-sc"}

FENCE = re.compile(r"^ *```.*?^ *```", re.S | re.M)
INLINE = re.compile(r"(?<!`)`([^`]+)`(?!`)")
STARTS = ("python train.py", "make train", "torchrun ")


@dataclass
class Command:
    source: str  # file:line
    text: str  # the command line as written (continuations joined, placeholders substituted)
    overrides: list[str] = field(default_factory=list)
    multirun: bool = False
    elided: bool = False  # a bare `...` was dropped


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _code_lines(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """(line number, command) for each line of a code block that starts a command; `\\` continuations joined."""
    found, current, start = [], None, 0
    for number, line in lines:
        stripped = line.strip()
        if current is not None:
            current += " " + stripped.removesuffix("\\").strip()
        elif stripped.startswith(STARTS):
            current, start = stripped.removesuffix("\\").strip(), number
        if current is not None and not stripped.endswith("\\"):
            found.append((start, current))
            current = None
    return found


def raw_commands(path: Path) -> list[tuple[int, str]]:
    """(line number, command as written) of every train.py command in a Markdown file."""
    text = path.read_text()
    found = []
    for block in FENCE.finditer(text):
        first = _line_of(text, block.start())
        found += _code_lines([(first + i, line) for i, line in enumerate(block.group(0).splitlines())])
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)  # keep the line numbers
    indented = [(i + 1, line) for i, line in enumerate(prose.splitlines()) if line.startswith("    ")]
    found += _code_lines(indented)
    for span in INLINE.finditer(prose):
        code = " ".join(span.group(1).split())
        if "python train.py" in code or code.startswith(STARTS):
            found.append((_line_of(prose, span.start()), code))
    # a torchrun line of another project (docs/migration.md quotes FlagEmbedding's) is not one of ours
    return [(number, command) for number, command in found
            if not command.startswith("torchrun ") or "train.py" in command]


def substitute(command: str) -> str:
    """Placeholders -> real values (composing reads no file)."""
    return re.sub(r"<[^<>]*>", "placeholder", command).replace("$PWD", "/tmp")


def parse(source: str, command: str) -> Command:
    """The overrides and flags of one command line (shell quoting and comments as bash reads them)."""
    command = substitute(command)
    words = shlex.split(command, comments=True)
    if words[:2] == ["make", "train"]:
        args = [w.split("=", 1)[1] for w in words[2:] if w.startswith("ARGS=")]
        words = ["train.py", *shlex.split(args[0])] if args else ["train.py"]
    at = next(i for i, w in enumerate(words) if w.endswith("train.py"))
    words = words[at + 1:]
    cmd = Command(source, command, elided="..." in words)
    words = [w for w in words if w != "..."]
    while words:
        word = words.pop(0)
        if word.split("=", 1)[0] in FLAGS_WITH_VALUE:  # `--cfg job` or `--cfg=job`
            if "=" not in word and words and "=" not in words[0]:
                words.pop(0)
        elif word in ("-m", "--multirun"):
            cmd.multirun = True
        elif word in FLAGS:
            pass
        else:
            cmd.overrides.append(word)
    return cmd


def collect() -> list[Command]:
    commands, seen = [], set()
    for path in DOC_FILES:
        for number, raw in raw_commands(path):
            cmd = parse(f"{path.relative_to(REPO)}:{number}", raw)
            if (cmd.text, cmd.source.split(":")[0]) not in seen:
                seen.add((cmd.text, cmd.source.split(":")[0]))
                commands.append(cmd)
    return commands


def jobs(cmd: Command) -> list[list[str]]:
    """The override lists to compose: one for a plain run; for a sweep, every value of every swept key at least once
    (the others at their first value), as Hydra's basic sweeper would write each job's overrides."""
    parsed = OverridesParser.create().parse_overrides(cmd.overrides)
    if not cmd.multirun:
        return [cmd.overrides]
    choices = []
    for text, override in zip(cmd.overrides, parsed, strict=True):
        if override.is_sweep_override():
            key = override.get_key_element()
            choices.append([f"{key}={value}" for value in override.sweep_string_iterator()])
        else:
            choices.append([text])
    runs = [[values[0] for values in choices]]
    for i, values in enumerate(choices):
        runs += [[*(v[0] for v in choices[:i]), value, *(v[0] for v in choices[i + 1:])] for value in values[1:]]
    return runs


def compose_job(overrides: list[str], tmp_path: Path) -> tuple[DictConfig, dict]:
    """Compose as `python train.py <overrides>` does (the hydra node too: launchers, sweepers, run dir), then drop
    the hydra node and point the output at tmp_path, as the suite's make_cfg does; (config, Hydra's choices)."""
    cfg = compose("train", overrides=overrides, return_hydra_config=True)
    choices = dict(cfg.hydra.runtime.choices)
    multirun = cfg.hydra.mode == RunMode.MULTIRUN  # a preset's `hydra.mode: MULTIRUN` is -m without -m
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(tmp_path / "run")
        cfg.paths.cache_dir = str(tmp_path / "cache")
    return cfg, {**choices, "multirun": multirun}


def check(cmd: Command, tmp_path: Path, done: set | None = None) -> int:
    """Compose every job of one command line and check its config; returns the number of jobs composed. Jobs in
    ``done`` (the same overrides, composed for another line) are not composed again."""
    composed = 0
    for overrides in jobs(cmd):
        if done is not None:
            if (key := (tuple(overrides), cmd.elided)) in done:
                continue
            done.add(key)
        cfg, choices = compose_job(overrides, tmp_path)
        # what train.py checks from Hydra's runtime, which composing has not: a launcher without -m
        problems = config_problems(cfg) + launcher_problems(choices, cmd.multirun or choices["multirun"])
        if cmd.elided:
            problems = [p for p in problems if "is required" not in p]
        assert not problems, f"{cmd.source}: `{cmd.text}`: " + "; ".join(problems)
        composed += 1
    return composed


@pytest.fixture
def hydra_conf():
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        yield
    GlobalHydra.instance().clear()


def test_every_documented_command_composes(hydra_conf, tmp_path: Path):
    commands = collect()
    failures, composed, done = [], 0, set()
    for cmd in commands:
        if cmd.text in SKIPPED:
            continue
        try:
            composed += check(cmd, tmp_path, done)
        except Exception as err:  # report every broken line at once, not just the first
            failures.append(f"{cmd.source}: `{cmd.text}`\n    {type(err).__name__}: {str(err).splitlines()[0]}")
    assert not failures, f"{len(failures)} documented command(s) do not compose:\n" + "\n".join(failures)
    assert composed >= 30, composed
    print(f"composed {composed} distinct jobs from {len(commands)} documented command lines")


def test_the_collector_finds_commands_in_the_readme_and_the_docs():
    commands = collect()
    readme = [c for c in commands if c.source.startswith("README.md")]
    docs = [c for c in commands if c.source.startswith("docs/")]
    assert len(readme) >= 10 and len(docs) >= 10, (len(readme), len(docs))
    assert len(commands) >= 40
    # each kind of line the collector must understand is there, parsed as bash would
    texts = {c.text for c in commands}
    assert any(c.multirun and "hydra/launcher=slurm" in c.overrides for c in commands)  # -m with a launcher
    assert any("--cfg" in t for t in texts)  # a Hydra flag with a value
    assert any(t.startswith("torchrun") for t in texts)  # torchrun ... train.py ...
    assert any(c.source.startswith("docs/") and len(c.overrides) > 8 for c in commands)  # `\` continuations
    assert "data.sources={qa: {type: jsonl, train_file: qa.jsonl}}" in {o for c in commands for o in c.overrides}
    assert all(not set(t) & {"<", ">"} for t in texts)  # every placeholder substituted


def test_the_parser_reads_flags_make_and_placeholders():
    cmd = parse("x", "python train.py --cfg job -m model.lr=1e-5,2e-5 hydra/launcher=slurm  # a comment")
    assert cmd.multirun and cmd.overrides == ["model.lr=1e-5,2e-5", "hydra/launcher=slurm"]
    assert parse("x", "python train.py --cfg=hydra --resolve -p model seed=1").overrides == ["seed=1"]
    cmd = parse("x", 'make train ARGS="model=gte_small data.train_file=<run dir>/mined.jsonl ..."')
    assert cmd.overrides == ["model=gte_small", "data.train_file=placeholder/mined.jsonl"] and cmd.elided
    assert jobs(parse("x", "python train.py -m a=1,2 b=3,4,5 c=6")) == [
        ["a=1", "b=3", "c=6"], ["a=2", "b=3", "c=6"], ["a=1", "b=4", "c=6"], ["a=1", "b=5", "c=6"]]


@pytest.mark.parametrize("line", [
    "python train.py model.lrr=1e-5",  # a renamed key
    "python train.py model=gte_huge",  # a removed option
    "python train.py -m hydra/launcher=slurmm",  # a launcher that does not exist
    "python train.py data.batch_size=abc",  # a wrong value, caught by the run's own config check
    "python train.py -m model.lr=1e-5,2e-5 loss.temprature=0.05,0.02",  # a typo in a sweep
    "python train.py hydra/launcher=slurm model.lr=1e-5",  # a launcher without -m: would run on this machine
    "python train.py loss=distill_kl",  # distillation from the demo data, which has no teacher scores
])
def test_a_broken_line_fails(hydra_conf, tmp_path: Path, line: str):
    with pytest.raises((ConfigCompositionException, AssertionError)):
        check(parse("x", line), tmp_path)


def test_the_sweeps_are_expanded(hydra_conf, tmp_path: Path):
    assert check(parse("x", "python train.py -m debug=fast strategy=ddp devices=2,1 model.lr=1e-3,2e-3"),
                 tmp_path) == 3
    # a sweep without -m is what Hydra refuses too
    with pytest.raises(ConfigCompositionException):
        check(parse("x", "python train.py model.lr=1e-5,2e-5"), tmp_path)


def test_nothing_is_skipped_without_a_reason():
    assert all(reason.strip() for reason in SKIPPED.values())
    stale = set(SKIPPED) - {c.text for c in collect()}
    assert not stale, f"SKIPPED lists lines no document holds any more: {stale}"

