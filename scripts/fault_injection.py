"""Kill -9 a training run at random moments, start it again with the same command, and check that it ends with
bit-identical weights and metrics to an uninterrupted run.

    python scripts/fault_injection.py --variants base,workers,hard-negatives,ddp --kills 20

For each variant: one uninterrupted reference run, then runs that are SIGKILLed (the whole process group: every
rank and DataLoader worker, as when a node dies) and restarted with the same command into the same run folder until
they finish. A run that finishes without being killed again is compared with the reference: every tensor of the
final ``last.ckpt`` and of ``model/`` equal (torch.equal), and ``metrics.json``'s validation numbers, step and
train metrics equal. A run takes up to ``--kills-per-run`` kills (each restart resumes the previous restart)
before it may finish; then a new run starts, until ``--kills`` kills have landed.

Kill moments cycle through: a random time (uniform over 90% of the reference run's wall time), SIGTERM or SIGINT at
a random training step (sent to the run's main process, as ``kill`` or Ctrl+C would: it must exit with 143 or 130 within
two minutes, having saved ``last.ckpt`` at its next step, and the restart resumes from there), inside a checkpoint
write (half the bytes written), between the two renames of a checkpoint save (``last.ckpt`` moved to
``previous.ckpt``, the new one not yet in place), and inside the exports (a finished export not yet renamed into
place). The last three are injected by this script's ``--child`` wrapper (patches of ``torch.save`` and
``os.replace`` in the training process), not by the project's code.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
KILL_KINDS = ("time", "sigterm", "ckpt-write", "sigint", "ckpt-rename", "time", "export")
# a polite stop: the signal to the run's main process (rank 0), which must save, exit with this code, and resume
STOP_SIGNALS = {"sigterm": (signal.SIGTERM, 143), "sigint": (signal.SIGINT, 130)}
EXPORT_TARGETS = {"model", "hf", "metrics.json", "metrics.md", "model.onnx"}

# a 2-epoch run of the tiny model: ~40 steps, validation every 7, last.ckpt every 3 steps
BASE = ["model=tiny", "data.batch_size=8", "data.max_train_rows=160", "data.max_val_queries=32",
        "data.eval_batch_size=256", "trainer.max_epochs=2", "trainer.val_check_interval=7",
        "callbacks.last_checkpoint.every_n_steps=3", "callbacks.last_checkpoint.every_n_minutes=null",
        "+callbacks.throughput.print_every_n_steps=1", "callbacks.progress_bar=null", "logger=csv"]
VARIANTS = {
    "base": [],
    "workers": ["data.num_workers=2"],
    "hard-negatives": ["data=jsonl", "data.train_file={hard_negatives}", "data.num_negatives=2"],
    "ddp": ["strategy=ddp", "devices=2"],
}


# --- the child: train.py with a fault armed ------------------------------------------------------------------
def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(kind: str, nth: int) -> None:
    """Patch the training process so that it SIGKILLs itself at the ``nth`` matching event."""
    import torch

    seen = [0]

    def hit() -> bool:
        seen[0] += 1
        return seen[0] == nth

    if kind == "ckpt-write":
        real_save = torch.save

        def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
            if ".ckpt" in str(getattr(f, "name", f)) and hit():
                buffer = io.BytesIO()
                real_save(obj, buffer)
                f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
                f.flush()
                _die()
            real_save(obj, f, *args, **kwargs)

        torch.save = save
    elif kind in ("ckpt-rename", "export"):
        real_replace = os.replace

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            name = Path(dst).name
            if kind == "export" and name in EXPORT_TARGETS and hit():
                _die()  # the export is complete in its temporary folder, not yet in place
            real_replace(src, dst, *args, **kwargs)
            if kind == "ckpt-rename" and name == "previous.ckpt" and hit():
                _die()  # last.ckpt was moved aside, the new one is not in place yet

        os.replace = replace


def child(kind: str, nth: int, overrides: list[str]) -> None:
    if kind != "none":
        _arm(kind, nth)
    import runpy

    sys.argv = [str(REPO / "train.py"), *overrides]  # DDP's other ranks re-run this: plain train.py, unarmed
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


# --- the harness ---------------------------------------------------------------------------------------------
def _env(cache: Path) -> dict[str, str]:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline", "TOKENIZERS_PARALLELISM": "false",
            "GTE_PRO_CACHE": str(cache), "PYTHONUNBUFFERED": "1"}


def _start(run: Path, overrides: list[str], cache: Path, kind: str, nth: int, log: Path) -> subprocess.Popen:
    command = [sys.executable, __file__, "--child", kind, str(nth), "--", *overrides,
               f"paths.cache_dir={cache}", f"hydra.run.dir={run}"]
    return subprocess.Popen(command, cwd=REPO, env=_env(cache), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)  # its own process group: kill every rank and worker at once


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _stop(proc: subprocess.Popen, kind: str, log: Path, within: float = 120.0) -> int:
    """Send SIGTERM or SIGINT to the run's main process; it must exit with 143 or 130 within ``within`` seconds."""
    signum, code = STOP_SIGNALS[kind]
    proc.send_signal(signum)
    try:
        rc = proc.wait(timeout=within)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        raise RuntimeError(f"{kind}: the run did not stop within {within:.0f} s, see {log}") from None
    if rc == -signum:  # the default action: only before the run set its handler up, or after it finished
        text = log.read_text(errors="replace")
        if _last_step(log) and "metrics: " not in text:
            raise RuntimeError(f"{kind}: the run died of the signal during training, see {log}")
        return 0 if "metrics: " in text else rc
    if rc not in (0, code):
        raise RuntimeError(f"{kind}: the run exited with {rc}, not {code}, see {log}")
    return rc


def _wait_for_step(proc: subprocess.Popen, log: Path, step: int, timeout: float) -> int | None:
    """None once the run has logged ``step`` (or a later one); its exit code if it ended first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return proc.returncode
        if _last_step(log) >= step:
            return None
        time.sleep(0.05)
    return None


def _last_step(log: Path) -> int:
    steps = re.findall(r"step (\d+)/", log.read_text(errors="replace"))
    return int(steps[-1]) if steps else 0


def _checkpoint_step(run: Path) -> int:
    """The step a restart will resume from (0: none; the project's own fallback order)."""
    import torch

    from gte_pro.launch.checkpoint_io import is_intact

    for name in ("last.ckpt", "previous.ckpt"):
        path = run / "checkpoints" / name
        if path.is_file() and is_intact(path) is None:
            return int(torch.load(path, map_location="cpu", weights_only=True)["global_step"])
    return 0


def _tensors(run: Path) -> dict[str, Any]:
    import torch
    from safetensors.torch import load_file

    found = {f"ckpt:{k}": v for k, v in torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu",
                                                     weights_only=True)["state_dict"].items()}
    for path in sorted((run / "model").rglob("*.safetensors")):
        found.update({f"{path.relative_to(run)}:{k}": v for k, v in load_file(path).items()})
    return found


def _metrics(run: Path) -> dict[str, Any]:
    blob = json.loads((run / "metrics.json").read_text())
    train = {k: v for k, v in blob["train"].items() if not k.endswith("_per_s")}  # wall-clock rates differ
    return {"val": blob["val"], "val_before": blob["val_before"], "train": train, "global_step": blob["global_step"],
            "best": Path(blob["best_checkpoint"] or "").name}


def identical(run: Path, reference: Path) -> tuple[bool, bool]:
    """(every weight bit-identical, metrics.json numbers equal)."""
    import torch

    ours, theirs = _tensors(run), _tensors(reference)
    same_weights = ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
    return same_weights, _metrics(run) == _metrics(reference)


def hard_negatives_file(folder: Path, rows: int = 200) -> Path:
    """Synthetic rows with 4 hard negatives each (more than data.num_negatives: the draw among them matters)."""
    rng = random.Random(0)
    words = "index vector query corpus token batch model score rank dense sparse embed train loss".split()
    path = folder / "hard_negatives.jsonl"
    with path.open("w") as out:
        for i in range(rows):
            text = lambda n: " ".join(rng.choice(words) for _ in range(n))  # noqa: E731
            out.write(json.dumps({"query": f"question {i}: {text(6)}", "positive": f"answer {i}: {text(20)}",
                                  "negatives": [f"other {i}.{j}: {text(20)}" for j in range(4)]}) + "\n")
    return path


def run_variant(name: str, kills: int, kills_per_run: int, work: Path, cache: Path, rng: random.Random,
                timeout: float) -> dict:
    overrides = [o.format(hard_negatives=work / "hard_negatives.jsonl") for o in BASE + VARIANTS[name]]
    reference = work / f"{name}-reference"
    start = time.monotonic()
    proc = _start(reference, overrides, cache, "none", 0, work / f"{name}-reference.log")
    if proc.wait(timeout=timeout) != 0:
        raise RuntimeError(f"{name}: the reference run failed, see {work / f'{name}-reference.log'}")
    span = time.monotonic() - start
    total_steps = _last_step(work / f"{name}-reference.log")
    stats = {"variant": name, "kills": 0, "resumed": 0, "runs": 0, "identical": 0, "same_metrics": 0,
             "steps_lost_max": 0, "reference_s": round(span, 1), "by_kind": {}}
    started = time.monotonic()
    missed = 0  # runs in a row that finished with a write fault armed that never fired
    while stats["kills"] < kills:
        run = work / f"{name}-run{stats['runs']}"
        shutil.rmtree(run, ignore_errors=True)
        landed = 0  # kills this run has taken: up to kills_per_run, then it may finish
        for attempt in range(4 * kills_per_run + 4):
            armed = stats["kills"] < kills and landed < kills_per_run
            kind = KILL_KINDS[stats["kills"] % len(KILL_KINDS)] if armed else "none"  # three kills: three kinds
            nth = rng.randint(1, 12) if kind.startswith("ckpt") else rng.randint(1, 3)
            log = work / f"{name}-run{stats['runs']}-{attempt}.log"
            timed = kind == "time" or kind in STOP_SIGNALS
            proc = _start(run, overrides, cache, "none" if timed else kind, nth, log)
            if kind in STOP_SIGNALS:  # during training: at a random step of those the reference logged
                rc = _wait_for_step(proc, log, rng.randint(1, max(1, total_steps - 2)), timeout)
                rc = _stop(proc, kind, log) if rc is None else rc
            else:
                try:
                    rc = proc.wait(timeout=rng.uniform(1.0, 0.9 * span) if timed else timeout)
                except subprocess.TimeoutExpired:
                    rc = None
            if rc == 0:
                missed = missed + 1 if kind in ("ckpt-write", "ckpt-rename", "export") else 0
                if missed == 3:  # each run makes ~13 such writes: a hook that never fires no longer matches them
                    raise RuntimeError(f"{name}: the {kind} fault never fired in 3 runs (n-th write <= 12): its hook "
                                       f"no longer matches how a run writes, see {log}")
                break  # finished: unarmed, or before the kill landed
            if kind in STOP_SIGNALS and rc in (STOP_SIGNALS[kind][1], -STOP_SIGNALS[kind][0]):
                _kill_group(proc)  # a DDP rank or worker still exiting
                landed += 1
                stats["kills"] += 1
                stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
                resumes_at = _checkpoint_step(run)
                stats["resumed"] += int(resumes_at > 0)
                stats["stop_steps_lost_max"] = max(stats.get("stop_steps_lost_max", 0), _last_step(log) - resumes_at)
                continue
            if rc is None or rc == -signal.SIGKILL:
                _kill_group(proc)
                landed += 1
                stats["kills"] += 1
                stats["by_kind"][kind] = stats["by_kind"].get(kind, 0) + 1
                resumes_at = _checkpoint_step(run)
                stats["resumed"] += int(resumes_at > 0)
                stats["steps_lost_max"] = max(stats["steps_lost_max"], _last_step(log) - resumes_at)
                continue
            raise RuntimeError(f"{name}: run exited with {rc}, see {log}")
        else:
            raise RuntimeError(f"{name}: {run} never finished")
        stats["runs"] += 1
        same_weights, same_metrics = identical(run, reference)
        stats["identical"] += int(same_weights)
        stats["same_metrics"] += int(same_metrics)
        print(f"{name}: run {stats['runs']} finished after {stats['kills']} kills so far: "
              f"weights {'identical' if same_weights else 'DIFFERENT'}, "
              f"metrics {'equal' if same_metrics else 'DIFFERENT'}", flush=True)
    stats["wall_s"] = round(time.monotonic() - started, 1)
    return stats


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        kind, nth, separator, *overrides = sys.argv[2:]
        assert separator == "--"
        return child(kind, int(nth), overrides)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="base,workers,hard-negatives,ddp")
    parser.add_argument("--kills", type=int, default=20, help="kills per variant")
    parser.add_argument("--kills-per-run", type=int, default=5, help="kills a run takes before it may finish")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a single run may take")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gte_pro_faults_"))
    work.mkdir(parents=True, exist_ok=True)
    hard_negatives_file(work)
    rng = random.Random(args.seed)
    results = [run_variant(v, args.kills, args.kills_per_run, work, work / "cache", rng,
                           args.timeout) for v in args.variants.split(",")]
    print("\n| variant | kills | restarts that resumed from a checkpoint | runs | bit-identical weights | "
          "same metrics.json | steps lost at most | kill moments |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(r["by_kind"].items()))
        print(f"| {r['variant']} | {r['kills']} | {r['resumed']} | {r['runs']} | {r['identical']}/{r['runs']} | "
              f"{r['same_metrics']}/{r['runs']} | {r['steps_lost_max']} | {kinds} |")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if any(r["identical"] != r["runs"] or r["same_metrics"] != r["runs"] for r in results):
        sys.exit(1)


if __name__ == "__main__":
    main()
