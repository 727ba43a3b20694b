"""Bad-input fuzzing: every malformed input ends in a clear error or a counted drop, never anything else.

The inputs (tests/fuzz_inputs.py: JSON lines, Hugging Face datasets, BEIR folders; tests/fuzz_cli.py: Hydra
overrides and launcher settings) are generated deterministically. Each goes through the code a run would use
(the data modules' ``setup`` with the token cache, ``load_beir`` plus the tokenizer, Hydra compose plus
``check_config`` and the builders, the launchers' pre-submission checks), and its outcome is one of:

- clear error: a user's mistake (``gte_pro.errors``: a ``DataError`` for data; for the command line our
  ``ConfigError`` and kin or a Hydra composition error) that the command line prints as one line naming the file and
  the line or row and the field, or the config key, and one line saying how to fix it, with no traceback;
- counted drop: the run goes on, and the cleaning report (or the BEIR set's ``anomalies``) counts what was dropped,
  cut or repaired;
- read as intended: only for legal variants of a format (a BOM, CRLF line ends, a null title), which must read
  exactly like the plain input;
- failure: anything else: another exception type (a bare TypeError, UnicodeDecodeError, ...), a message that does
  not name the place, a run that accepted a bad input without counting it, a run on zero rows, or a token cache
  folder left half-written.

    .venv/bin/pytest tests/test_fuzz.py -q        # prints "fuzz: N inputs, ... 0 failures" (and the failures)
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gte_pro.errors import DataError, explain, user_error
from gte_pro.modes.build_data import data_module
from tests.conftest import CONF
from tests.fuzz_cli import cli_cases
from tests.fuzz_inputs import Case, data_cases

SMALL = {"batch_size": 2, "eval_batch_size": 8, "val_fraction": 0.25, "max_length": 32}


# --- running one input --------------------------------------------------------------------------------------------
def _module_outcome(module: Any) -> tuple[int, Any]:
    """(counted drops, what was read) of a data module after setup; one batch of each loader must come out."""
    if not len(module.train_rows) or not module.retrieval.queries:
        raise AssertionError("ran on zero rows")
    next(iter(module.train_dataloader()))
    loaders = module.val_dataloader()
    next(iter(loaders[0] if isinstance(loaders, list) else loaders))
    counted = sum(sum(r["dropped"].values()) + sum(r.get("cleaned", {}).values()) for r in module.reports)
    rows = [(ex.query, ex.positives, ex.negatives) for ex in module.train_rows]
    return counted, (rows, module.retrieval.queries, module.retrieval.corpus)


def _load_beir_both_ways(folder: Path, tokenizer: Any, cache: Path) -> Any:
    """``load_beir`` (corpus in memory, what data=beir reads) and ``load_beir_stored`` (corpus tokenized on disk,
    what eval.beir reads) must agree: both fail with a DataError, or both give the same set."""
    from gte_pro.data.beir import load_beir
    from gte_pro.data.corpus_store import load_beir_stored
    from gte_pro.errors import DataError

    outcomes: list[Any] = []
    for load in (lambda: load_beir(folder, "test"),
                 lambda: load_beir_stored(folder, "test", None, tokenizer, 32, "", cache / "stores")):
        try:
            outcomes.append(load())
        except DataError as error:
            outcomes.append(error)
    memory, stored = outcomes
    if isinstance(memory, DataError) or isinstance(stored, DataError):
        assert isinstance(memory, DataError) and isinstance(stored, DataError), (memory, stored)
        raise memory
    assert (stored.queries, stored.relevant, stored.query_ids) == (memory.queries, memory.relevant, memory.query_ids)
    assert len(stored.corpus) == len(memory.corpus) and stored.anomalies == memory.anomalies
    return memory


def run_data(kind: str, ctx: dict[str, Any], tokenizer: Any, cache: Path) -> tuple[int, Any]:
    if kind == "beir":
        beir = _load_beir_both_ways(ctx["folder"], tokenizer, cache)
        tokenizer(beir.queries + beir.corpus, truncation=True, max_length=32)  # every text must be encodable
        return sum(getattr(beir, "anomalies", {}).values()), (beir.queries, beir.corpus, beir.relevant, beir.query_ids)
    if kind == "jsonl":

        module = data_module("jsonl", train_file=ctx["train_file"], val_file=ctx.get("val_file"), tokenizer=tokenizer,
                             cache_dir=str(cache), **SMALL)
    elif kind == "hf":

        options = {k: ctx[k] for k in ("columns", "train_split", "val_split") if k in ctx}
        module = data_module("hf", path=ctx["path"], tokenizer=tokenizer, cache_dir=str(cache), **SMALL, **options)
    else:

        module = data_module("beir", path=str(ctx["folder"]), val_splits=["dev"], tokenizer=tokenizer,
                             cache_dir=str(cache), **SMALL)
    module.setup("fit")
    return _module_outcome(module)


def run_cli(kind: str, ctx: dict[str, Any], tokenizer: Any, folder: Path, cache: Path) -> None:
    """What a run does with its command line before any heavy work; raises on a bad one."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.utils import instantiate
    from omegaconf import open_dict

    from gte_pro.config.checks import check_config
    from gte_pro.evaluation.sets import load_eval_sets
    from gte_pro.launch.environment import (
        check_devices_match_tasks,
        check_multi_node_launch,
        tasks_per_node_from_scheduler,
    )
    from gte_pro.modes.build import build_datamodule, build_trainer
    from hydra_plugins.gte_pro_launcher.launchers import _check_jobs

    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=ctx["overrides"], return_hydra_config=kind == "launcher")
    if kind == "launcher":
        launcher = instantiate(cfg.hydra.launcher)
        launcher.setup(hydra_context=None, task_function=None, config=cfg)
        _check_jobs(launcher, ctx["jobs"])  # what the launcher runs before submitting anything
        return
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder / "run")
        cfg.paths.cache_dir = str(cache)
    check_config(cfg)  # train() starts here
    check_devices_match_tasks(cfg.devices, tasks_per_node_from_scheduler())  # then job_scope
    check_multi_node_launch(cfg.nodes)
    load_eval_sets(cfg, tokenizer)
    datamodule = build_datamodule(cfg, tokenizer)
    if ctx["setup"]:
        datamodule.setup("fit")
    build_trainer(cfg, [], [])


# --- judging the outcome ------------------------------------------------------------------------------------------
def judge_error(error: Exception, case: Case, ctx: dict[str, Any]) -> str | None:
    """None if ``error`` is a clear error for ``case``, else why not. Clear: what the command line prints for it
    (``explain``) is one line naming the place and one saying how to fix it, no traceback; data errors are
    DataErrors."""
    lines = explain(error)
    if lines is None:  # the command line would show a bug's traceback
        return f"bare {type(error).__name__}: {str(error)[:300]}"
    if case.kind in ("jsonl", "hf", "beir", "beir_train") and not isinstance(user_error(error), DataError):
        return f"{type(user_error(error)).__name__} for bad data, not a DataError: {lines[0][:300]}"
    if any("\n" in line or "Traceback" in line or not line for line in lines):
        return f"not two plain lines: {lines}"
    needed = ([str(ctx["file"])] if ctx.get("file") else []) + [s for s in (case.where, case.field) if s]
    missing = [n for n in needed if n not in " ".join(lines)]
    return f"{type(user_error(error)).__name__} does not name {missing}: {lines}" if missing else None


def _cache_problem(cache: Path, before: set[str], failed: bool) -> str | None:
    """A failed build leaves nothing in the token cache; a finished one leaves complete folders only."""
    root = cache / "tokenized"
    now = {p.name for p in root.iterdir()} if root.is_dir() else set()
    new = now - before
    if leftovers := sorted(n for n in now if ".tmp" in n):
        return f"temporary cache folders left behind: {leftovers}"
    if failed and new:
        return f"a failed run left cache folders: {sorted(new)}"
    if half := sorted(n for n in new if not {"meta.json", "train.arrow"} <= {p.name for p in (root / n).iterdir()}):
        return f"incomplete cache folders: {half}"
    return None


def outcome(case: Case, folder: Path, tokenizer: Any, cache: Path, baselines: dict[str, Any]) -> tuple[str, str]:
    """("error" | "drop" | "valid" | "failure", detail) of one input."""
    folder.mkdir(parents=True)
    ctx = case.make(folder)
    data = case.kind in ("jsonl", "hf", "beir", "beir_train")
    before = {p.name for p in (cache / "tokenized").iterdir()} if (cache / "tokenized").is_dir() else set()
    try:
        if data:
            counted, read = run_data(case.kind, ctx, tokenizer, cache)
        else:
            run_cli(case.kind, ctx, tokenizer, folder, cache)
    except Exception as error:  # the point of the test: every exception is judged, none escapes
        problem = judge_error(error, case, ctx) or (_cache_problem(cache, before, True) if data else None)
        return ("failure", problem) if problem else ("error", str(error).splitlines()[0][:160])
    if not data:
        return "failure", "accepted silently"
    if problem := _cache_problem(cache, before, False):
        return "failure", problem
    if counted:
        return "drop", f"{counted} counted"
    if not case.valid:
        return "failure", "accepted without an error or a count"
    expected = run_data(case.kind, ctx["clean"], tokenizer, cache)[1] if "clean" in ctx else baselines[case.kind]
    return ("valid", "as the clean input") if read == expected else ("failure", "read differently from the clean input")


# --- the test -----------------------------------------------------------------------------------------------------
@pytest.fixture
def fast_fingerprint(monkeypatch: pytest.MonkeyPatch) -> None:
    """Hashing the tokenizer (0.3 s) once instead of once per input: the same tokenizer object gives the same hash."""
    from gte_pro.data import cache, token_cache

    memo: dict[int, str] = {}

    def fingerprint(tokenizer: Any) -> str:
        if id(tokenizer) not in memo:
            memo[id(tokenizer)] = cache.tokenizer_fingerprint(tokenizer)
        return memo[id(tokenizer)]

    if hasattr(token_cache, "tokenizer_fingerprint"):
        monkeypatch.setattr(token_cache, "tokenizer_fingerprint", fingerprint)


def _baselines(root: Path, tokenizer: Any, cache: Path) -> dict[str, Any]:
    """What the clean inputs read as (legal variants must read the same)."""
    from tests.beir_data import write_beir_folder
    from tests.fuzz_inputs import clean_jsonl

    train = root / "clean.jsonl"
    train.write_bytes(clean_jsonl())
    folder = write_beir_folder(root / "clean_beir")
    return {"jsonl": run_data("jsonl", {"train_file": str(train)}, tokenizer, cache)[1],
            "beir": run_data("beir", {"folder": folder}, tokenizer, cache)[1]}


def test_every_malformed_input_ends_in_a_clear_error_or_a_counted_drop(tmp_path: Path, tokenizer, monkeypatch,
                                                                       fast_fingerprint, capsys):
    import datasets

    datasets.disable_progress_bars()
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")  # local JSON folders
    cache = tmp_path / "cache"
    baselines = _baselines(tmp_path, tokenizer, cache)
    cases = data_cases() + cli_cases()
    results: list[tuple[Case, str, str]] = []
    for index, case in enumerate(cases):
        with monkeypatch.context() as scoped:
            for key in ("SUBMITIT_LOCAL_NTASKS", "SLURM_JOB_ID", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
                scoped.delenv(key, raising=False)
            for key, value in (case.env or {}).items():
                scoped.setenv(key, value)
            kind, detail = outcome(case, tmp_path / f"case{index:03d}", tokenizer, cache, baselines)
        results.append((case, kind, detail))
    counts = Counter(kind for _, kind, _ in results)
    failures = [f"  [{case.kind}] {case.name}: {detail}" for case, kind, detail in results if kind == "failure"]
    summary = (f"fuzz: {len(results)} inputs, {counts['error']} clear errors, {counts['drop']} counted drops, "
               f"{counts['valid']} legal variants read as the clean input, {counts['failure']} failures")
    by_kind = Counter((case.kind, kind) for case, kind, _ in results)
    with capsys.disabled():
        print(f"\n{summary}\n  by source: " + ", ".join(f"{k} {o}: {n}" for (k, o), n in sorted(by_kind.items())))
        if failures:
            print("\n".join(failures))
    assert len(results) >= 200
    assert not failures, summary + "\n" + "\n".join(failures)


def test_every_shipped_option_passes_the_config_checks():
    """No false alarm: each option of each config group (with the values it requires) composes into a config
    that ``check_config`` accepts, in one Hydra session."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from gte_pro.config.checks import config_problems

    required = {"model=encoder": ["model.name_or_path=x"], "data=jsonl": ["data.train_file=x"],
                "data=hf": ["data.path=x"], "data=beir": ["data.path=x"],
                "data=mix": ["data.sources={a: {type: demo}}"],
                "experiment=byo_hard_negatives": ["data.train_file=x"], "experiment=distill": ["data.train_file=x"],
                # a reranker's model and losses go with task=rerank (and only with it: tests/test_rerank.py)
                "model=cross_encoder": ["task=rerank", "model.name_or_path=x"],
                **{f"model={name}": ["task=rerank"] for name in ("reranker_minilm", "reranker_tiny",
                                                                "gte_reranker_modernbert", "gte_multilingual_reranker",
                                                                "bge_reranker_base")},
                "loss=listwise": ["task=rerank"], "loss=pointwise_bce": ["task=rerank"],
                # distillation learns a file's teacher scores: the demo corpus has none (refused, tests/test_no_traps)
                "loss=distill_kl": ["data=jsonl", "data.train_file=x"],
                "loss=margin_mse": ["data=jsonl", "data.train_file=x"],
                # mpnet's folder is fetched by `make fetch-mpnet`, not here; decoder names no model
                "model=mpnet": ["model.name_or_path=x"], "model=decoder": ["model.name_or_path=x"]}
    groups = [p for p in CONF.iterdir() if p.is_dir() and p.name not in ("hydra", "paths")]
    choices = [f"{group.name}={option.stem}" for group in sorted(groups) for option in sorted(group.glob("*.yaml"))]
    problems = {}
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        for choice in choices + ["strategy=ddp devices=2", "lr_find=true", "mode=eval"]:
            cfg = compose("train", overrides=choice.split() + required.get(choice, []))
            with open_dict(cfg):
                cfg.paths.output_dir = "/tmp/run"
            if found := config_problems(cfg):
                problems[choice] = found
    GlobalHydra.instance().clear()
    assert len(choices) > 35 and not problems, problems
