"""The malformed command lines of tests/test_fuzz.py: Hydra overrides and launcher settings.

A case's error must name ``field`` (the config key, or the override as typed) and ``where`` (a valid choice or
what is expected), when given.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.beir_data import write_beir_folder
from tests.fuzz_inputs import Case


def cli(overrides: list[str] | Callable[[Path], list[str]], key: str | None, expected: str | None = None,
        setup: bool = False, kind: str = "cli", env: dict[str, str] | None = None, names_file: bool = True) -> Case:
    """Compose ``overrides``; with ``setup`` also read the data. Overrides made from the case's folder name files
    in it: the error must then name the folder too (unless ``names_file`` is false)."""
    def make(folder: Path) -> dict[str, Any]:
        made = {"overrides": overrides(folder) if callable(overrides) else overrides, "setup": setup}
        return {**made, "file": folder} if callable(overrides) and names_file else made
    shown = "<files>" if callable(overrides) else " ".join(overrides)
    return Case(f"{kind}: {shown}"[:90], kind, make, expected, key, env=env)


def _group_cases() -> list[Case]:
    wrong = {"model": ("gte_huge", "minilm"), "data": ("csv", "jsonl"), "loss": ("triplet", "infonce"),
             "optimizer": ("sgd", "adamw"), "scheduler": ("step", "cosine"), "strategy": ("deepspeed", "ddp"),
             "precision": ("fp8", "bf16-mixed"), "callbacks": ("all", "default"), "logger": ("mlflow", "csv"),
             "trainer": ("fast", "default"), "debug": ("slow", "fast"), "experiment": ("nope", "minilm_cpu"),
             "hparams_search": ("grid", "optuna"), "eval": ("beir", "default"), "export": ("onnx", "default"),
             "paths": ("cluster", "default"), "hydra/launcher": ("slurmm", "slurm")}
    cases = [cli([f"{group}={bad}"], f"{group}/{bad}", good) for group, (bad, good) in wrong.items()]
    cases += [cli(["~model"], "model", "minilm"), cli(["~data"], "data", "jsonl")]
    return cases


def _key_cases() -> list[Case]:
    unknown = ["modle=tiny", "data.batchsize=8", "trainer.max_epoch=2", "model.learning_rate=1", "devicess=2",
               "eval.bier=[x]", "loss.temp=0.1", "seeds=1"]
    cases = [cli([override], override.split("=")[0]) for override in unknown]
    cases.append(cli(["data=hf", "data.path=x", "data.columns.querry=x"], "data.columns.querry"))
    cases += [cli(["+data.bogus=1"], "data.bogus", "batch_size"), cli(["+model.foo=2"], "model.foo", "pooling"),
              cli(["+loss.margin=0.2"], "loss.margin", "temperature"),
              cli(["data=hf", "data.path=x", "+data.columns.extra=x"], "extra", "negatives")]
    syntax = {"data.batch_size=[1,2": "[1,2", "model.lr=1e-3)": "model.lr=1e-3)", "data.batch_size": "data.batch_size",
              "++": "++", "data.batch_size=${oops}": "data.batch_size", "devices=${oc.env:GTE_PRO_NOT_SET}": "devices"}
    cases += [cli([override], key) for override, key in syntax.items()]
    cases += [cli(["data=jsonl"], "data.train_file", "required"), cli(["data=hf"], "data.path", "required"),
              cli(["data=beir"], "data.path", "required"), cli(["model=encoder"], "model.name_or_path", "required")]
    return cases


def _value_cases() -> list[Case]:
    bad = {
        "data.batch_size": ["abc", "1", "0", "-4", "1.5", "null", "[1,2]", "{a:1}", "1e9999", "true", "''"],
        "data.max_length": ["abc", "0"], "data.num_negatives": ["-1", "abc"], "data.num_workers": ["-1", "two"],
        "data.val_fraction": ["1.5", "-0.1", "abc", "1"], "data.max_train_rows": ["0", "abc"],
        "data.min_query_chars": ["-1"], "data.group_by_length": ["yes"], "data.pin_memory": ["1"],
        "data.eval_batch_size": ["0"], "data.length_window": ["0"], "model.lr": ["abc", "null", "[1]"],
        "model.trust_remote_code": ["'false'", "yes", "1"], "model.pooling": ["max"], "model.normalize": ["maybe"],
        "loss.temperature": ["0", "-0.05", "abc"], "loss.mini_batch_size": ["0"],
        "loss.max_skipped_steps": ["-1", "many"],
        "seed": ["abc", "-1", "1.5", str(2**40)], "devices": ["abc", "0", "-2", "1.5", "true", "[]"],
        "nodes": ["abc", "0", "-1", "1.5"],
        "trainer.max_epochs": ["abc", "1.5"], "trainer.max_steps": ["abc", "-5"],
        "trainer.accumulate_grad_batches": ["0", "abc"], "trainer.gradient_clip_val": ["-1", "abc"],
        "trainer.limit_train_batches": ["-1", "abc"], "trainer.val_check_interval": ["0"],
        "eval.batch_size": ["0"], "mode": ["serve"], "lr_find": ["maybe"], "lr_find_steps": ["0"],
        "matmul_precision": ["ultra"],
    }
    return [cli([f"{key}={value}"], key, "valid choices" if key in ("devices", "mode", "model.pooling",
                                                                    "matmul_precision") else None)
            for key, values in bad.items() for value in values]


def _path_cases() -> list[Case]:
    def beir_folder(folder: Path) -> Path:
        return write_beir_folder(folder / "scifake")

    return [
        cli(lambda f: ["data=jsonl", f"data.train_file={f / 'none.jsonl'}"], "none.jsonl", "not found", setup=True),
        cli(lambda f: ["data=jsonl", f"data.train_file={f}"], "is a folder", "JSON-lines", setup=True),
        cli(lambda f: ["data=beir", f"data.path={f / 'nowhere'}"], "nowhere", "not a BEIR folder", setup=True),
        cli(lambda f: ["data=hf", f"data.path={f / 'nowhere'}"], "nowhere", "could not load", setup=True),
        cli(lambda f: [f"eval.beir={f / 'nowhere'}"], "nowhere", "not a BEIR folder"),
        cli(lambda f: [f"eval.beir=[{f / 'nowhere'}]"], "nowhere", "not a BEIR folder"),
        cli(["eval.beir=[{folder: x}]"], "eval.beir[0]", "unknown keys: folder"),
        cli(["eval.beir=[{path: null}]"], "eval.beir[0]", "path"),
        cli(["eval.beir=[[a,b]]"], "eval.beir[0]", "path"),
        cli(["eval.beir=5"], "eval.beir", "list"),
        cli(lambda f: [f"eval.beir=[{beir_folder(f)},{f / 'scifake'}]"], "eval.beir", "named scifake",
            names_file=False),
        cli(lambda f: [f"eval.beir=[{beir_folder(f)}]", "eval.split=nope"], "nope.tsv", "dev, test, train"),
    ]


def _launcher_cases() -> list[Case]:
    def launcher(overrides: list[str], key: str, expected: str | None = None, jobs: list[list[str]] | None = None,
                 slurm: bool = False) -> Case:
        case = cli(["hydra/launcher=" + ("slurm" if slurm else "local"), *overrides], key, expected,
                   kind="launcher")
        case.make = (lambda make: lambda f: {**make(f), "jobs": jobs or [[]]})(case.make)
        return case

    return [
        launcher(["devices=2", "hydra.launcher.tasks_per_node=1"], "tasks_per_node", "devices=2"),
        launcher(["devices=1", "hydra.launcher.tasks_per_node=2"], "tasks_per_node", "devices=1"),
        launcher(["devices=4", "hydra.launcher.tasks_per_node=2"], "tasks_per_node", "devices=4", slurm=True),
        launcher([], "tasks_per_node", "devices=2", jobs=[["devices=1"], ["devices=2"]]),
        # the submitit configs type tasks_per_node as an integer: Hydra itself refuses these, naming the key
        launcher(["devices=abc"], "tasks_per_node", "Integer"),
        launcher(["hydra.launcher.tasks_per_node=abc"], "hydra.launcher.tasks_per_node"),
        launcher(["hydra.launcher.tasks_per_node=0"], "tasks_per_node", "valid choices"),
        launcher([], "devices", "valid choices", jobs=[["devices=two"]]),
        launcher(["hydra.launcher.name='x\nrm -rf / #'"], "hydra.launcher.name", "newline", slurm=True),
        launcher(["hydra.launcher.partition='gpu\rrm -rf ~'"], "hydra.launcher.partition", "newline", slurm=True),
        launcher(["+hydra.launcher.additional_parameters={mail-type: 'END\nrm -rf ~'}"], "additional_parameters",
                 "newline", slurm=True),
        launcher(["+hydra.launcher.additional_parameters={mail\\ type: x}"], "additional_parameters",
                 "option name", slurm=True),
        launcher(["hydra.launcher.setup=['module load cuda\nrm -rf ~']"], "hydra.launcher.setup[0]", "newline",
                 slurm=True),
        launcher(["hydra.sweep.dir='/tmp/x\ny'"], "submitit_folder", "newline", slurm=True),
        cli(["devices=2"], "devices=2", "task(s) per node", kind="scheduler", env={"SUBMITIT_LOCAL_NTASKS": "1"}),
        # the topology: nodes x devices, one source for the trainer and the launcher
        cli(["nodes=2", "trainer.num_nodes=1"], "trainer.num_nodes", "nodes=2"),
        cli(["nodes=2"], "nodes=2", "multi-node launcher", kind="scheduler"),
        launcher(["nodes=2"], "nodes=2", "hydra/launcher=local"),
        launcher([], "hydra.launcher.nodes", "nodes=2", jobs=[["nodes=1"], ["nodes=2"]], slurm=True),
        launcher(["nodes=2", "hydra.launcher.nodes=1"], "hydra.launcher.nodes", "nodes=2", slurm=True),
        cli(["devices=1"], "devices=1", "task(s) per node", kind="scheduler",
            env={"SLURM_JOB_ID": "7", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NAME": "train"}),
    ]


def cli_cases() -> list[Case]:
    return _group_cases() + _key_cases() + _value_cases() + _path_cases() + _launcher_cases()
