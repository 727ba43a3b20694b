"""The whole-run rows of ``.gpu/run.sh``: what a user's ``python train.py`` does on a GPU, each row a real run (a
fresh ``train.py`` process into its own folder), its result printed as it ends, none started that cannot end by the
deadline.

Usage::

    python benchmarks/gpu_run_rows.py [--rows whole,resume,ddp,fsdp,compile] [--deadline S] [--cpu]
        [--tokenizer DIR] [--shape minilm] [--work DIR] [--json FILE]

Rows, in this order:

- ``whole``: the default run (``model=minilm``'s recipe, demo data, 1 epoch of batch 32) with random weights of the
  ``--shape`` (MiniLM's 6 x 384: its 90 MB of weights do not travel to a device machine; the tokenizer from
  ``--tokenizer``), ``precision=bf16-mixed trainer.accelerator=gpu``: validation before and after, every export
  loaded back and matched (train.py's own checks: each export against the module, a state-dict round trip, and on a
  GPU the CPU's embeddings against the GPU's, ``export.gpu_max_abs_diff``). Prints wall time, val figures, the
  export checks and the memory plan's estimate beside ``torch.cuda.max_memory_allocated`` (metrics.json's
  ``memory``).
- ``resume``: the same command with ``trainer.deterministic=true`` (``torch.use_deterministic_algorithms``, and
  ``CUBLAS_WORKSPACE_CONFIG=:4096:8`` in the environment) and ``last.ckpt`` every ``--ckpt-every`` steps: one
  uninterrupted reference run, then a run SIGKILLed (its whole process group) once it has passed half its steps and
  saved a checkpoint, started again with the same command into the same folder. The resumed run's safetensors
  (``model/`` and ``hf/``) must be bit-identical to the reference's; the largest difference is printed either way,
  and beside it the ``whole`` row's (not deterministic) difference from the reference and the two training times:
  what determinism costs. Should ``true`` fail (an op without a deterministic kernel), the row retries with ``warn``.
- ``ddp``, ``fsdp``: the ``whole`` command with ``strategy=ddp devices=1`` / ``strategy=fsdp devices=1``: one process
  group of one GPU, i.e. NCCL's code path (gloo on a CPU); ``compile``: with ``model.compile=true``. Each prints what
  ``whole`` prints and its val/ndcg@10 and weights beside ``whole``'s.

Before a row starts, its time is estimated from the ``whole`` row's measured wall time (a prior until then:
``ESTIMATES``); a row that would end past ``--deadline`` (seconds from this script's start) is not started and is
listed as not run. A row still running at the deadline is killed. ``--cpu``: the same rows on the CPU (tiny shape,
fp32, gloo, 10 steps of texts cut at 64 tokens): a rehearsal of ``.gpu/run.sh`` (``GPU_RUN_CPU=1``). The runs'
folders and logs stay in ``--work``; a failed row prints its log's last lines (a device call returns 8 files).

This file is the driver: the rows, the plan and the command line. A run's process (start, watch, kill) is
train_process.py's; what a finished run says (metrics.json, its weights, its printed line) is gpu_run_results.py's."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench_gpu import SIZES, fits
from gpu_run_results import compare, row_line, summarise
from train_process import fresh, kill_group, last_step, start, tail, wait

ROWS = ("whole", "resume", "ddp", "fsdp", "compile")
# the seconds a row takes, as (times the whole row's wall time, plus seconds); the whole row's own prior until it ran
ESTIMATES = {"whole": (1.0, 0.0), "resume": (2.6, 0.0), "ddp": (1.1, 5.0), "fsdp": (1.1, 10.0),
             "compile": (1.0, 90.0)}
WHOLE_PRIOR_S = {"gpu": 120.0, "cpu": 90.0}
# the resume row's runs: last.ckpt every few steps (weights untouched), a plain line per step (the kill watches it)
RESUME_EXTRA = ["+callbacks.throughput.print_every_n_steps=1", "callbacks.progress_bar=null"]
# the CPU rehearsal trains 10 steps of shorter texts (the default run's 78 steps take minutes on 2 shared cores)
CPU_DATA = ["data.max_train_rows=320", "data.max_length=64"]
ROW_EXTRA = {"whole": [], "resume": ["trainer.deterministic=true", *RESUME_EXTRA],
             "ddp": ["strategy=ddp", "devices=1"], "fsdp": ["strategy=fsdp", "devices=1"],
             "compile": ["model.compile=true"]}
# cuBLAS's reproducible workspace (Lightning sets it too for trainer.deterministic=true; here before CUDA starts)
DETERMINISTIC_ENV = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
NO_DETERMINISTIC_KERNEL = "does not have a deterministic implementation"


@dataclass
class Plan:
    """Which rows start: each only where its estimate ends by the deadline (seconds from the start)."""

    deadline: float
    whole_prior: float
    whole_s: float | None = None
    not_run: list[dict[str, Any]] = field(default_factory=list)

    def expected(self, row: str) -> float:
        times, extra = ESTIMATES[row]
        return times * (self.whole_s if self.whole_s is not None else self.whole_prior) + extra

    def admit(self, row: str, elapsed: float) -> bool:
        expected = self.expected(row)
        if fits(elapsed, expected, self.deadline):
            return True
        self.not_run.append({"row": row, "elapsed_s": round(elapsed, 1), "expected_s": round(expected, 1),
                             "deadline_s": self.deadline})
        return False


# --- the rows' command ---------------------------------------------------------------------------------------
def base_overrides(shape: str, cpu: bool, cache: Path, tokenizer: str | None) -> list[str]:
    """The default run's command, with random weights of ``shape`` and the device's precision and accelerator."""
    overrides = [f"++model.random_init_config.{key}={value}" for key, value in SIZES[shape].items()]
    overrides += ["++model.random_init_config.max_position_embeddings=512", f"paths.cache_dir={cache}"]
    overrides += ["precision=32-true", "trainer.accelerator=cpu", *CPU_DATA] if cpu else [
        "precision=bf16-mixed", "trainer.accelerator=gpu"]
    if tokenizer:
        overrides.append(f"model.name_or_path={Path(tokenizer).resolve()}")
    return overrides


# --- the rows ------------------------------------------------------------------------------------------------
@dataclass
class Context:
    base: list[str]
    work: Path
    ckpt_every: int
    env: dict[str, str]
    deadline_at: float  # time.monotonic() at the deadline
    results: dict[str, dict[str, Any]] = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline_at - time.monotonic()


def plain_run(ctx: Context, name: str, extra: list[str], env: dict[str, str] | None = None) -> dict[str, Any]:
    """One uninterrupted train.py run of the base command plus ``extra``: its summary (or its error and log tail)."""
    run, log = fresh(ctx.work, name)
    began = time.monotonic()
    rc = wait(start([*ctx.base, *extra], run, log, env or ctx.env), ctx.left())
    wall = time.monotonic() - began
    if rc != 0:
        reason = "killed at the deadline" if rc is None else f"exit code {rc}"
        return {"row": name, "error": reason, "wall_s": wall, "log_tail": tail(log)}
    return {"row": name, "wall_s": wall, "run": str(run), **summarise(run)}


def row_whole(ctx: Context) -> dict[str, Any]:
    return plain_run(ctx, "whole", ROW_EXTRA["whole"])


def row_variant(ctx: Context, name: str) -> dict[str, Any]:
    result = plain_run(ctx, name, ROW_EXTRA[name])
    whole = ctx.results.get("whole")
    if "error" not in result and whole and "error" not in whole:
        same = compare(Path(result["run"]), Path(whole["run"]))
        result["vs_whole"] = {"val_delta": result["val"] - whole["val"], **same}
    return result


def killed_then_resumed(ctx: Context, extra: list[str], run: Path, log: Path, steps: int) -> dict[str, Any]:
    """Start the run, SIGKILL its process group once it is past half its steps with a checkpoint saved, start the
    same command again into the same folder and let it finish."""
    ckpt = run / "checkpoints" / "last.ckpt"
    proc = start([*ctx.base, *extra], run, log, ctx.env | DETERMINISTIC_ENV)
    killed_at = None
    while proc.poll() is None and ctx.left() > 0:
        step = last_step(log.read_text(errors="replace"))
        if step >= steps // 2 and ckpt.is_file():
            kill_group(proc)
            killed_at = step
            break
        time.sleep(0.05)
    if killed_at is None:
        if proc.poll() is None:
            kill_group(proc)
        return {"error": f"not killed: the run ended (exit code {proc.returncode}) before step {steps // 2}"}
    import torch

    resumed_from = int(torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"])
    rc = wait(start([*ctx.base, *extra], run, log, ctx.env | DETERMINISTIC_ENV), ctx.left())
    if rc != 0:
        return {"error": "the restart was killed at the deadline" if rc is None else f"the restart exited with {rc}"}
    return {"killed_at_step": killed_at, "resumed_from_step": resumed_from, "steps": steps}


def row_resume(ctx: Context) -> dict[str, Any]:
    began = time.monotonic()
    extra = [*ROW_EXTRA["resume"], f"callbacks.last_checkpoint.every_n_steps={ctx.ckpt_every}"]
    reference = plain_run(ctx, "resume-reference", extra, ctx.env | DETERMINISTIC_ENV)
    if "error" in reference and NO_DETERMINISTIC_KERNEL in reference.get("log_tail", ""):
        print("resume: trainer.deterministic=true failed (an op without a deterministic kernel, log below); "
              f"again with warn\n{reference['log_tail']}", flush=True)
        extra = ["trainer.deterministic=warn", *extra[1:]]
        reference = plain_run(ctx, "resume-reference-warn", extra, ctx.env | DETERMINISTIC_ENV)
    if "error" in reference:
        return {**reference, "row": "resume", "wall_s": time.monotonic() - began}
    steps = reference["global_step"]
    run, log = fresh(ctx.work, "resume-killed")
    outcome = killed_then_resumed(ctx, extra, run, log, steps)
    if "error" in outcome:
        return {"row": "resume", "error": outcome["error"], "wall_s": time.monotonic() - began, "log_tail": tail(log)}
    resumed = summarise(run)
    outcome["deterministic"] = extra[0].split("=")[1]
    outcome["vs_reference"] = compare(run, Path(reference["run"]))
    outcome["training_s_deterministic"] = reference["timing"].get("training")
    whole = ctx.results.get("whole")
    if whole and "error" not in whole:
        outcome["whole_vs_reference"] = compare(Path(whole["run"]), Path(reference["run"]))
        outcome["training_s_whole"] = whole["timing"].get("training")
    return {**resumed, "row": "resume", "wall_s": time.monotonic() - began, "run": str(run), "resume": outcome}


RUNNERS: dict[str, Callable[[Context], dict[str, Any]]] = {
    "whole": row_whole, "resume": row_resume, "ddp": lambda ctx: row_variant(ctx, "ddp"),
    "fsdp": lambda ctx: row_variant(ctx, "fsdp"), "compile": lambda ctx: row_variant(ctx, "compile")}


def run_rows(names: list[str], plan: Plan, ctx: Context, began: float,
             save: Callable[[list[dict[str, Any]], list[dict[str, Any]]], None],
             runners: dict[str, Callable[[Context], dict[str, Any]]] = RUNNERS,
             clock: Callable[[], float] = time.monotonic) -> list[dict[str, Any]]:
    """Each row in order, where it fits the plan; its line printed and everything saved as it ends."""
    done: list[dict[str, Any]] = []
    for name in names:
        if not plan.admit(name, clock() - began):
            skipped = plan.not_run[-1]
            print(f"{name}: not run: {skipped['expected_s']:.0f} s expected, {skipped['elapsed_s']:.0f} s gone of "
                  f"{plan.deadline:.0f}", flush=True)
            continue
        result = runners[name](ctx)
        ctx.results[name] = result
        if name == "whole" and "error" not in result:
            plan.whole_s = result["wall_s"]
        done.append(result)
        print(row_line(result), flush=True)
        if "error" in result and result.get("log_tail"):
            print(f"--- {name}: the log's last lines ---\n{result['log_tail']}\n---", flush=True)
        save(done, plan.not_run)
    return done


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    parser.add_argument("--deadline", type=float, default=400.0,
                        help="seconds from the start by which every started row must end")
    parser.add_argument("--cpu", action="store_true", help="the CPU rehearsal: fp32, the CPU accelerator, gloo")
    parser.add_argument("--shape", default=None, help=f"of {', '.join(SIZES)} (default: minilm; tiny with --cpu)")
    parser.add_argument("--tokenizer", default=None, help="the BERT tokenizer's folder (default: the packaged MiniLM)")
    parser.add_argument("--ckpt-every", type=int, default=None,
                        help="the resume row's last.ckpt cadence in steps (default: 10; 4 with --cpu)")
    parser.add_argument("--work", type=Path, default=Path("/tmp/gte-pro-gpu-runs"), help="the runs' folders")
    parser.add_argument("--json", type=Path, default=None, help="write the rows' results here")
    args = parser.parse_args(argv)
    args.row_list = [name.strip() for name in args.rows.split(",") if name.strip()]
    if unknown := sorted(set(args.row_list) - set(ROWS)):
        parser.error(f"--rows: unknown {', '.join(unknown)}; valid choices: {', '.join(ROWS)}")
    args.shape = args.shape or ("tiny" if args.cpu else "minilm")
    if args.shape not in SIZES:
        parser.error(f"--shape: unknown {args.shape}; valid choices: {', '.join(SIZES)}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    began = time.monotonic()
    args.work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONUNBUFFERED": "1"}
    ctx = Context(base_overrides(args.shape, args.cpu, args.work / "cache", args.tokenizer), args.work,
                  args.ckpt_every or (4 if args.cpu else 10), env, began + args.deadline)
    plan = Plan(args.deadline, WHOLE_PRIOR_S["cpu" if args.cpu else "gpu"])
    print(f"whole-run rows {', '.join(args.row_list)}: shape {args.shape}, deadline {args.deadline:.0f} s, "
          f"runs in {args.work}\n$ python train.py {' '.join(ctx.base)}", flush=True)

    def save(rows: list[dict[str, Any]], not_run: list[dict[str, Any]]) -> None:
        if args.json:
            args.json.write_text(json.dumps({"settings": {**vars(args), "work": str(args.work), "json": str(
                args.json)}, "base": ctx.base, "rows": rows, "not_run": not_run}, indent=2, default=str))

    results = run_rows(args.row_list, plan, ctx, began, save)
    save(results, plan.not_run)
    failed = [r["row"] for r in results if "error" in r]
    resumed = ctx.results.get("resume", {}).get("resume")
    if resumed and not resumed["vs_reference"]["identical"]:
        failed.append("resume (weights differ)")
    print(f"whole-run rows done in {time.monotonic() - began:.0f} s: {len(results)} run, "
          f"{len(plan.not_run)} not run" + (f"; FAILED: {', '.join(failed)}" if failed else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
