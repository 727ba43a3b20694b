"""What the quality benchmarks share: the pydocs retrieval set, ``train.py`` runs in fresh processes with the same
base overrides, the untrained model's score, and per-run records that let a benchmark cut short (or extended by
seeds or variants) run only what is missing (``--reuse``) or just print its table (``--report``)."""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import harness
from harness import Result


def add_arguments(parser: argparse.ArgumentParser, workdir: str, variants: tuple[str, ...]) -> None:
    """The options every pydocs benchmark takes (variants, set, length of training, model, where runs go, reuse)."""
    parser.add_argument("--variants", default=",".join(variants), help=f"comma-separated, of {', '.join(variants)}")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-test", type=int, default=500)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=None, help="trainer.max_steps instead of --epochs")
    parser.add_argument("--model", default="minilm")
    parser.add_argument("--lr", default="2e-5")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--override", action="append", default=[], help="extra train.py override (repeatable)")
    harness.add_common(parser, workdir=workdir,
                       json="write every run's result to this file (default: <workdir>/results.json)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    parser.add_argument("--report", action="store_true",
                        help="only the table of the runs already recorded (implies --reuse); runs nothing")
    parser.add_argument("--reuse", action="store_true",
                        help="keep the result of a run whose command is unchanged: a benchmark cut short, or "
                             "extended by seeds or variants, only runs what is missing")


def finish_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     variants: tuple[str, ...]) -> argparse.Namespace:
    args.reuse = args.reuse or args.report
    args.seed_list = harness.int_list(args.seeds)
    args.variant_list = args.variants.split(",")
    unknown = sorted(set(args.variant_list) - set(variants))
    if unknown:
        parser.error(f"--variants: unknown {', '.join(unknown)}; valid choices: {', '.join(variants)}")
    return args


def announce(commands: Sequence[list[str]], args: argparse.Namespace) -> bool:
    """Print the commands a benchmark will run; whether to run them (not with ``--dry-run``)."""
    print("commands (in this order):\n" + "\n".join(shlex.join(c) for c in commands))
    return not args.dry_run


def length(args: argparse.Namespace) -> str:
    """How long each run trains, for the line above the table."""
    return f"{args.steps} steps" if args.steps else f"{args.epochs} epochs"


def print_report(header: str, before: str | None, table: str, after: Sequence[str], rows: list[Result]) -> None:
    """The settings line and the machine, the untrained model's line (``before``), the table, ``after`` (e.g. a
    verdict), then each failed run with its reason."""
    print(f"\n{header}\n{harness.machine()}\n")
    if before:
        print(f"untrained model: {before}\n")
    print(table)
    for line in after:
        print(line)
    for row in rows:
        if "error" in row:
            print(f"FAILED: {row['variant']} seed {row['seed']}: {row['error']}")


def save(args: argparse.Namespace, commands: Sequence[list[str]], **parts: object) -> None:
    """``--json`` (default ``<workdir>/results.json``): the options, the commands and the results."""
    harness.save(args, str(Path(args.workdir) / "results.json"), commands=[shlex.join(c) for c in commands], **parts)


def pydocs_set(args: argparse.Namespace) -> Path:
    """The retrieval set's folder: built (deterministically) on first use."""
    folder = Path(args.workdir) / f"pydocs_{args.max_train}_{args.max_test}"
    if not args.dry_run and not (folder / "train.jsonl").is_file():
        from gte_pro.data.pydocs import build_pydocs

        build_pydocs(folder, args.max_train, args.max_test, seed=0)
    return folder


def common_overrides(args: argparse.Namespace, data: Path, validate_in_fit: bool = True) -> list[str]:
    """``validate_in_fit`` false: no validation inside trainer.fit at all, so that the training phase's seconds and
    peak memory are training alone (the run's final validation scores the last weights either way)."""
    # validation after training only (the untrained model is evaluated once, by untrained_command): each validation
    # embeds the whole corpus, and no checkpoint is selected
    never = f"trainer.check_val_every_n_epoch={10**6}"
    length = [f"trainer.max_steps={args.steps}", "trainer.max_epochs=-1", "trainer.val_check_interval=null",
              never] if args.steps else [
        f"trainer.max_epochs={args.epochs}", f"trainer.check_val_every_n_epoch={args.epochs}" if validate_in_fit
        else never]
    return [f"model={args.model}", "data=jsonl", f"eval.beir=[{data / 'beir'}]", f"model.lr={args.lr}",
            f"data.batch_size={args.batch_size}", *length, "callbacks=none", "+trainer.enable_checkpointing=false",
            "export.hf=false", "export.model_card=false", "logger=csv", "eval.before=false",
            f"paths.cache_dir={Path(args.workdir) / 'cache'}", *args.override]


def run(cmd: list[str], log: Path, args: argparse.Namespace) -> Result:
    print(f"$ {shlex.join(cmd)}", file=sys.stderr, flush=True)
    return harness.run_train(cmd, log, args.timeout)


def recorded(command: list[str], record: Path, args: argparse.Namespace) -> Result | None:
    """The result kept in ``record`` for this very command (``--reuse``), else None."""
    if args.reuse and record.is_file() and json.loads(record.read_text()).get("command") == command:
        print(f"reused: {record}", file=sys.stderr, flush=True)
        blob = json.loads(record.read_text())
        return blob["result"] if "result" in blob else blob["ndcg"]  # "ndcg": the untrained score's older record
    return None


def keep(command: list[str], record: Path, result: Result) -> None:
    record.write_text(json.dumps({"command": command, "result": result}, default=str) + "\n")


def untrained_command(args: argparse.Namespace, data: Path, extra: tuple[str, ...] = ()) -> list[str]:
    """NDCG@10 of the model before any training, once for every run (``mode=eval`` on the same set and lengths)."""
    work = Path(args.workdir)
    return harness.train_command("mode=eval", f"model={args.model}", f"eval.beir=[{data / 'beir'}]",
                                 f"paths.cache_dir={work / 'cache'}", f"hydra.run.dir={work / 'runs' / 'untrained'}",
                                 *extra, *args.override)


def recorded_run(command: list[str], record: Path, args: argparse.Namespace,
                 finish: Callable[[Result], Result] = lambda result: result,
                 clear: Path | None = None) -> Result | None:
    """The result kept in ``record`` for this very command (``--reuse``); else, unless ``--report`` (None), the
    command run now (its log beside ``record``; ``clear``, its run folder, emptied first: never resumed), its result
    ``finish``ed, kept when it succeeded."""
    kept = recorded(command, record, args)
    if kept is not None or args.report:
        return kept
    if clear is not None:
        shutil.rmtree(clear, ignore_errors=True)
    result = finish(run(command, record.with_suffix(".log"), args))
    if "error" not in result:
        keep(command, record, result)
    return result


def untrained_metrics(args: argparse.Namespace, data: Path, extra: tuple[str, ...] = ()) -> dict[str, float] | None:
    """The untrained model's metrics on the set (``ndcg@10``, and ``dim<d>/ndcg@10`` with eval.truncate_dims)."""
    runs, prefix = Path(args.workdir) / "runs", f"val/{(data / 'beir').name}/"

    def metrics(result: Result) -> Result:
        if "error" in result:
            return result
        flat = json.loads((runs / "untrained" / "metrics.json").read_text())["val"]
        return {key[len(prefix):]: value for key, value in flat.items() if key.startswith(prefix)}

    got = recorded_run(untrained_command(args, data, extra), runs / "untrained.json", args, metrics)
    if got is None or (isinstance(got, dict) and "error" in got):
        return None
    return got if isinstance(got, dict) else {"ndcg@10": got}  # a float: the untrained score's older record


def train_recorded(command: list[str], folder: Path, row: Result, args: argparse.Namespace,
                   read: Callable[[Path], Result]) -> Result:
    """One training run in ``folder`` (a fresh one, never resumed), or its kept result; ``read`` turns the finished
    run folder into figures."""
    got = recorded_run(command, folder.with_suffix(".json"), args, clear=folder,
                       finish=lambda result: {**row, **result, **({} if "error" in result else read(folder))})
    return {**row, "not_run": True} if got is None else got


def mean_std(values: list[float]) -> dict[str, float | None]:
    return {"mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values)}


def paired_bootstrap(variant: Sequence[Sequence[float]], reference: Sequence[Sequence[float]],
                     resamples: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """(mean difference, 2.5th, 97.5th percentile) of ``variant - reference`` per query, paired: one array of
    per-query scores per set (each already averaged over seeds), the queries of each set resampled with
    replacement (a fixed ``numpy`` generator), the difference averaged within each set and then over the sets."""
    import numpy as np

    rng = np.random.default_rng(seed)
    diffs = [np.asarray(v, dtype=np.float64) - np.asarray(r, dtype=np.float64)
             for v, r in zip(variant, reference, strict=True)]
    means = np.zeros(resamples)
    for d in diffs:
        means += d[rng.integers(0, len(d), size=(resamples, len(d)))].mean(axis=1)
    means /= len(diffs)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(np.mean([d.mean() for d in diffs])), float(low), float(high)


def planned_duration(plan: Sequence[tuple[list[str], Path, float]], args: argparse.Namespace,
                     rates: str) -> str:
    """The line printed before a benchmark starts: how many of ``plan``'s (command, record, modelled seconds) are
    kept (``--reuse``: a record of the same command) and how long the rest should take: the modelled seconds
    (``rates`` says from what), scaled by measured / modelled over the kept runs when there are any."""
    kept, kept_s, measured, modelled = 0, 0.0, 0.0, 0.0
    for command, record, seconds in plan:
        blob = json.loads(record.read_text()) if args.reuse and record.is_file() else {}
        if blob.get("command") == command:
            kept, kept_s = kept + 1, kept_s + seconds
            wall = (blob.get("result") or {}).get("wall_s") if isinstance(blob.get("result"), dict) else None
            if wall:
                measured, modelled = measured + wall, modelled + seconds
    todo = sum(seconds for _, _, seconds in plan) - kept_s
    factor = measured / modelled if modelled else 1.0
    how = (f"modelled x {factor:.2f}, the measured / modelled time of the {kept} finished run(s)" if modelled
           else f"modelled from {rates}; no finished run to measure from")
    return (f"planned: {len(plan) - kept} of {len(plan)} runs to do ({kept} kept), about "
            f"{todo * factor / 3600:.1f} h ({how})")
