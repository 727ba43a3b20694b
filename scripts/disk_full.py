"""A full disk at every write of a training run: each ends in the two-line error (exit 2, no traceback), and the same
command, once there is space again, ends bit-identical to an uninterrupted run.

    python scripts/disk_full.py --mode inject            # no root: the n-th write of each kind fails with ENOSPC
    python scripts/disk_full.py --mode tmpfs             # root: the run on a small tmpfs, filled to each level
    python scripts/disk_full.py --mode inject --kinds checkpoint-last,csv-logger --quick
    python scripts/disk_full.py --mode inject --task mine   # mode=mine: its corpus store, mined file and report
    python scripts/disk_full.py --mode inject --task score  # mode=score of a mined file: shards, scored file
    python scripts/disk_full.py --mode inject --task rerank # task=rerank: a cross-encoder's checkpoints and exports
    python scripts/disk_full.py --mode inject --task mine --fault kill   # kill -9 (or sigterm) at each write instead

``inject``: a ``--child`` wrapper runs train.py with a Python audit hook that fails the ``nth`` opening for writing
of a path of one kind (the run's log, lock and records, the token cache, the CSV logger, the best and the last
checkpoint, each export, metrics, curves) with ``OSError(ENOSPC)``, as a full disk does when a file is created.
Each kind is failed at its first and at its last write in the uninterrupted run (``--quick``: the first only).
Writes made outside Python's ``open`` (safetensors' and pyarrow's own writers) are not reached by it: ``tmpfs`` is.

``tmpfs``: the run folder and the cache on a tmpfs, with a filler file leaving a given number of bytes free, so that
the disk fills in the middle of whatever write comes then (a checkpoint, an export's weights, the token cache);
the levels run from nothing free to more than the whole run needs. Then the filler goes and the command runs again.

Each case prints one line: the kind or level, the error line the run printed, its exit code and whether a traceback
was printed, then the rerun's exit code and whether its weights, exported model and metrics equal the reference's.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import fault_injection  # noqa: E402

# task -> its command's overrides: the (two epochs of the tiny model, a validation at each epoch's end,
# exports on), mode=mine on the same data (a corpus store, the mined file, its report and plot), and mode=score of
# that mined file by the packaged MiniLM as the teacher ({mined}: made once per work folder, see score_input), and
# a reranker (task=rerank) trained on the demo data with the packaged MiniLM retrieving its validation candidates
TASKS = {"train": ["debug=fast", "seed=3", "trainer.max_epochs=2", "callbacks.progress_bar=null"],
         "mine": ["mode=mine", "debug=fast", "seed=3"],
         "score": ["mode=score", "debug=fast", "data=jsonl", "data.train_file={mined}", "score.teacher={minilm}",
                   "score.teacher_kind=embedder"],
         "rerank": ["task=rerank", "debug=fast", "seed=3", "model=reranker_tiny", "eval.retriever={minilm}",
                    "eval.rerank_depth=20", "data.num_negatives=3", "callbacks.progress_bar=null"]}
# kind -> the paths it writes (a regex over the path; a temporary sibling keeps its target's name in it)
KINDS = {
    "train.log": r"/train\.log$",
    "run-lock": r"/\.run\.lock",
    "run-records": r"/(run_config|val_before|decontamination|interrupted)\.json|/restarts\.jsonl",
    "token-cache": r"cache/.*tokenized/",
    "data-cache": r"cache/(?!.*tokenized/)",
    "csv-logger": r"/csv/",
    "checkpoint-best": r"/checkpoints/epoch[^/]*\.ckpt",
    "checkpoint-last": r"/checkpoints/last\.ckpt",
    "export-model": r"/model(\.tmp[^/]*)?/",
    "export-hf": r"/hf(\.tmp[^/]*)?/",
    "metrics": r"/metrics\.(json|md)",
    "curves": r"/curves\.png",
    "mined-file": r"/mined\.jsonl",
    "mine-report": r"/mine_report\.(json|md)|/mine_scores\.png",
    "score-shards": r"/score_shards/",
    "scored-file": r"/scored\.jsonl|/score_report",
}
COUNTS = "GTE_PRO_DISK_FULL_COUNTS"  # the child writes how many writes of each kind it saw here (the reference)
# the fault at the chosen write, and the exit code it must end with: a full disk (the two-line error), kill -9 (the
# process dies there), SIGTERM (the run stops, exit 143); the child reads it from FAULT
FAULTS = {"enospc": 2, "kill": -9, "sigterm": 143}
FAULT = "GTE_PRO_WRITE_FAULT"


# --- the child: train.py with one kind of write failing --------------------------------------------------------
def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


def child(kind: str, nth: int, overrides: list[str]) -> None:
    """Run train.py; the ``nth`` write of ``kind`` meets the fault named in $GTE_PRO_WRITE_FAULT (default ENOSPC;
    ``kind`` "none": count every kind's writes)."""
    counts = dict.fromkeys(KINDS, 0)
    patterns = {name: re.compile(pattern) for name, pattern in KINDS.items()}

    def hook(event: str, args: tuple) -> None:
        if event != "open" or not args or not isinstance(args[0], (str, Path)):
            return
        path, mode, flags = str(args[0]), args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None
        if not _writes(mode, flags):
            return
        for name, pattern in patterns.items():
            if pattern.search(path):
                counts[name] += 1
                if name == kind and counts[name] == nth:
                    fault = os.environ.get(FAULT, "enospc")
                    if fault == "kill":
                        os.kill(os.getpid(), signal.SIGKILL)
                    if fault == "sigterm":
                        os.kill(os.getpid(), signal.SIGTERM)  # the run's handler stops it inside this write
                        return
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    sys.addaudithook(hook)
    if os.environ.get(COUNTS):
        import atexit

        atexit.register(lambda: Path(os.environ[COUNTS]).write_text(json.dumps(counts)))
    import runpy

    sys.argv = [str(REPO / "train.py"), *overrides]
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


# --- the harness ---------------------------------------------------------------------------------------------
INPUTS: list[Path] = []  # where the reference run was made: the score task's input goes there, not on a full disk


def score_input(work: Path) -> Path:
    """The file mode=score reads: a mode=mine run's output, made once under ``work``."""
    mined = work / "score-input" / "mined.jsonl"
    if not mined.is_file():
        code = _run(mined.parent, work / "score-input-cache", work / "score-input.log", task="mine")
        if code != 0:
            raise RuntimeError(f"mode=mine for the score task's input failed (exit {code}), see {work}/score-input.log")
    return mined


def overrides(task: str, run: Path) -> list[str]:
    """``task``'s command for a run folder (score: the mined file made beside the run folders)."""
    if task not in ("score", "rerank"):
        return TASKS[task]
    from gte_pro import packaged_minilm_path

    values = {"minilm": packaged_minilm_path()}
    if task == "score":
        values["mined"] = score_input(INPUTS[-1] if INPUTS else run.parent)
    return [override.format(**values) for override in TASKS[task]]


def _run(run: Path, cache: Path, log: Path, kind: str = "none", nth: int = 0, env: dict[str, str] | None = None,
         timeout: float = 600.0, task: str = "train") -> int:
    command = [sys.executable, __file__, "--child", kind, str(nth), "--", *overrides(task, run),
               f"paths.cache_dir={cache}",
               f"hydra.run.dir={run}"]
    with log.open("w") as out:
        return subprocess.run(command, cwd=REPO, env={**fault_injection._env(cache), **(env or {})}, stdout=out,
                              stderr=subprocess.STDOUT, timeout=timeout).returncode


def _error_line(log: Path) -> tuple[str, bool]:
    """(the ``error:`` line the run printed, or its last line; whether it printed a traceback)."""
    text = log.read_text(errors="replace")
    lines = [line for line in text.splitlines() if line.strip()]
    error = next((line for line in lines if line.startswith("error: ")), lines[-1] if lines else "")
    return error, "Traceback (most recent call last)" in text


def same_run(run: Path, reference: Path) -> dict[str, bool]:
    """Training: every weight of last.ckpt, the exported model's bytes, metrics.json's numbers; mining and scoring:
    the written file's bytes (their reports hold timings)."""
    for output in ("mined.jsonl", "scored.jsonl"):
        if (reference / output).is_file():
            files = [folder / output for folder in (run, reference)]
            same = files[0].is_file() and files[0].read_bytes() == files[1].read_bytes()
            return {"weights": same, "exported": same, "metrics": same}
    weights, metrics = fault_injection.identical(run, reference)
    model = [folder / "model" / "model.safetensors" for folder in (run, reference)]
    exported = all(p.is_file() for p in model) and model[0].read_bytes() == model[1].read_bytes()
    return {"weights": weights, "exported": exported, "metrics": metrics}


def _case(name: str, run: Path, cache: Path, reference: Path, fail: Any, make_room: Any = None,
          task: str = "train", fault: str = "enospc") -> dict[str, Any]:
    """One fault: ``fail(run, cache, log)`` -> exit code; then ``make_room()`` and the same command again. The logs
    go beside the reference (not onto the full disk)."""
    started = time.monotonic()
    logs = reference.parent / "logs"
    logs.mkdir(exist_ok=True)
    code = fail(run, cache, logs / f"{run.name}.log")
    error, traceback = _error_line(logs / f"{run.name}.log")
    if make_room:
        make_room()
    rerun = _run(run, cache, logs / f"{run.name}.rerun.log", task=task)
    same = same_run(run, reference) if rerun == 0 else {"weights": False, "exported": False, "metrics": False}
    # a run that fitted on the disk (exit 0) is fine too, if it equals the reference
    expected = {"enospc": code == 2 and error.startswith("error: "), "kill": code == -9,
                "sigterm": code == 143 and "stopped by SIGTERM" in (logs / f"{run.name}.log").read_text()}[fault]
    ok = (expected and not traceback or code == 0) and rerun == 0 and all(same.values())
    return {"case": name, "ok": ok, "exit": code, "error": error, "traceback": traceback, "rerun_exit": rerun,
            **same, "seconds": round(time.monotonic() - started, 1)}


def reference_run(work: Path, task: str = "train") -> tuple[Path, dict[str, int]]:
    """The uninterrupted run, with how many writes of each kind it made."""
    INPUTS.append(work)
    reference, counts = work / "reference", work / "counts.json"
    code = _run(reference, work / "reference-cache", work / "reference.log", env={COUNTS: str(counts)}, task=task)
    if code != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {code}), see {work / 'reference.log'}")
    return reference, json.loads(counts.read_text())


def inject(work: Path, kinds: list[str] | None, quick: bool, reference: tuple[Path, dict[str, int]] | None = None,
           task: str = "train", fault: str = "enospc") -> list[dict[str, Any]]:
    """ENOSPC at the first (and, unless ``quick``, the last) write of each kind (None: every kind the task's run
    writes); ``reference``: an uninterrupted run already made (its folder and write counts)."""
    reference_folder, counts = reference or reference_run(work, task)
    results = []
    for kind in kinds or [kind for kind, count in counts.items() if count]:
        if counts[kind] == 0:
            results.append({"case": kind, "ok": False, "error": "the uninterrupted run made no such write"})
            continue
        for nth in sorted({1} if quick else {1, counts[kind]}):
            name = (f"{'' if task == 'train' else f'{task}: '}{'' if fault == 'enospc' else f'{fault} at '}{kind} "
                    f"#{nth}/{counts[kind]}")
            run = work / re.sub(r"\W+", "-", name).strip("-")
            result = _case(name, run, work / f"{run.name}-cache", reference_folder,
                           lambda r, c, log, k=kind, n=nth: _run(r, c, log, k, n, env={FAULT: fault}, task=task),
                           task=task, fault=fault)
            results.append(_report(result))
    return results


def _fill(mount: Path, free: int) -> Path:
    """A filler file leaving about ``free`` bytes free on ``mount``."""
    filler = mount / "filler"
    filler.unlink(missing_ok=True)
    size = max(shutil.disk_usage(mount).free - free, 0)
    with filler.open("wb") as out:
        chunk = b"\0" * (1 << 20)
        while size > 0:
            size -= out.write(chunk[: min(size, len(chunk))])
    return filler


def can_mount() -> bool:
    """Whether this process may mount a tmpfs (root, and a container that allows it)."""
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    with tempfile.TemporaryDirectory() as folder:
        probe = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", folder], capture_output=True)
        if probe.returncode != 0:
            return False
        subprocess.run(["umount", folder], check=False)
    return True


@contextlib.contextmanager
def small_disk(folder: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``folder`` (root only), unmounted afterwards."""
    if not can_mount():
        raise SystemExit("mounting a tmpfs needs root and a machine that allows it (or use --mode inject)")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size // 1024 + 1}k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def fill_levels(mount: Path, reference: Path, sizes: list[int], task: str = "train") -> list[dict[str, Any]]:
    """The run on ``mount`` with each of ``sizes`` bytes free, then (the filler gone) the same command again."""
    results = []
    for free in sizes:
        filler = _fill(mount, free)
        run, cache = mount / f"run-{free}", mount / f"cache-{free}"
        results.append(_report(_case(f"{free // 1024} KB free", run, cache, reference,
                                     lambda r, c, log: _run(r, c, log, task=task), make_room=filler.unlink,
                                     task=task)))
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return results


def footprint(run: Path) -> int:
    return sum(p.stat().st_size for p in run.rglob("*") if p.is_file())


def tmpfs(work: Path, levels: int, quick: bool, task: str = "train") -> list[dict[str, Any]]:
    reference, _ = reference_run(work, task)
    size = footprint(reference)
    levels_free = [0, 4096, 65536, 1 << 20] + [size * i // levels for i in range(1, levels + 1)]
    # the run needs up to four checkpoints at once (best, previous, last and the one being written)
    with small_disk(work / "small", size * 2 + (4 << 20)) as mount:
        return fill_levels(mount, reference, levels_free[:: 3 if quick else 1], task)


def _report(result: dict[str, Any]) -> dict[str, Any]:
    traceback = " with a TRACEBACK" if result["traceback"] else ""
    print(f"{result['case']}: {'ok' if result['ok'] else 'FAILED'} in {result['seconds']} s | exit "
          f"{result['exit']}{traceback} | {result['error'][:160]} | rerun exit {result['rerun_exit']}, "
          f"weights {result['weights']}, exported model {result['exported']}, metrics "
          f"{result['metrics']}", flush=True)
    return result


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]), sys.argv[5:])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("inject", "tmpfs"), default="inject")
    parser.add_argument("--task", choices=list(TASKS), default="train", help="the command whose disk fills")
    parser.add_argument("--fault", choices=list(FAULTS), default="enospc",
                        help="inject: what the chosen write meets (a full disk, kill -9, SIGTERM)")
    parser.add_argument("--kinds", default=None, help=f"inject: comma-separated, of {', '.join(KINDS)} (default: "
                                                      "every kind the task's run writes)")
    parser.add_argument("--levels", type=int, default=10, help="tmpfs: free-space levels up to the run's size")
    parser.add_argument("--quick", action="store_true", help="inject: first writes only; tmpfs: every third level")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gte_pro_disk_full_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.mode == "inject":
        kinds = args.kinds.split(",") if args.kinds else None
        unknown = sorted(set(kinds or []) - set(KINDS))
        if unknown:
            raise SystemExit(f"unknown kind(s) {', '.join(unknown)}; the kinds: {', '.join(KINDS)}")
        results = inject(work, kinds, args.quick, task=args.task, fault=args.fault)
    else:
        results = tmpfs(work, args.levels, args.quick, args.task)
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"disk full: {len(results) - len(failed)}/{len(results)} cases ok (work folder {work})"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
