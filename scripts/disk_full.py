"""A full disk at every write of a training run: each ends in the two-line error (exit 2, no traceback), and the same
command, once there is space again, ends bit-identical to an uninterrupted run.

    python scripts/disk_full.py --mode inject            # no root: the n-th write of each kind fails with ENOSPC
    python scripts/disk_full.py --mode tmpfs             # root: the run on a small tmpfs, filled to each level
    python scripts/disk_full.py --mode inject --kinds checkpoint-last,csv-logger --quick

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

# the command: two epochs of the tiny model, a validation at each epoch's end, exports on
RUN = ["debug=fast", "seed=3", "trainer.max_epochs=2", "callbacks.progress_bar=null"]
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
}
COUNTS = "GTE_PRO_DISK_FULL_COUNTS"  # the child writes how many writes of each kind it saw here (the reference)


# --- the child: train.py with one kind of write failing --------------------------------------------------------
def _writes(mode: Any, flags: Any) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT))


def child(kind: str, nth: int, overrides: list[str]) -> None:
    """Run train.py; the ``nth`` write of ``kind`` fails with ENOSPC (``kind`` "none": count every kind's writes)."""
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
                    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)

    sys.addaudithook(hook)
    if os.environ.get(COUNTS):
        import atexit

        atexit.register(lambda: Path(os.environ[COUNTS]).write_text(json.dumps(counts)))
    import runpy

    sys.argv = [str(REPO / "train.py"), *overrides]
    runpy.run_path(str(REPO / "train.py"), run_name="__main__")


# --- the harness ---------------------------------------------------------------------------------------------
def _run(run: Path, cache: Path, log: Path, kind: str = "none", nth: int = 0,
         env: dict[str, str] | None = None, timeout: float = 600.0) -> int:
    command = [sys.executable, __file__, "--child", kind, str(nth), "--", *RUN, f"paths.cache_dir={cache}",
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
    weights, metrics = fault_injection.identical(run, reference)
    model = [folder / "model" / "model.safetensors" for folder in (run, reference)]
    exported = all(p.is_file() for p in model) and model[0].read_bytes() == model[1].read_bytes()
    return {"weights": weights, "exported": exported, "metrics": metrics}


def _case(name: str, run: Path, cache: Path, reference: Path, fail: Any, make_room: Any = None) -> dict[str, Any]:
    """One fault: ``fail(run, cache, log)`` -> exit code; then ``make_room()`` and the same command again. The logs
    go beside the reference (not onto the full disk)."""
    started = time.monotonic()
    logs = reference.parent / "logs"
    logs.mkdir(exist_ok=True)
    code = fail(run, cache, logs / f"{run.name}.log")
    error, traceback = _error_line(logs / f"{run.name}.log")
    if make_room:
        make_room()
    rerun = _run(run, cache, logs / f"{run.name}.rerun.log")
    same = same_run(run, reference) if rerun == 0 else {"weights": False, "exported": False, "metrics": False}
    # a run that fitted on the disk (exit 0) is fine too, if it equals the reference
    ok = ((code == 2 and error.startswith("error: ") and not traceback) or code == 0) and rerun == 0 and all(
        same.values())
    return {"case": name, "ok": ok, "exit": code, "error": error, "traceback": traceback, "rerun_exit": rerun,
            **same, "seconds": round(time.monotonic() - started, 1)}


def reference_run(work: Path) -> tuple[Path, dict[str, int]]:
    """The uninterrupted run, with how many writes of each kind it made."""
    reference, counts = work / "reference", work / "counts.json"
    code = _run(reference, work / "reference-cache", work / "reference.log", env={COUNTS: str(counts)})
    if code != 0:
        raise RuntimeError(f"the uninterrupted run failed (exit {code}), see {work / 'reference.log'}")
    return reference, json.loads(counts.read_text())


def inject(work: Path, kinds: list[str], quick: bool,
           reference: tuple[Path, dict[str, int]] | None = None) -> list[dict[str, Any]]:
    """ENOSPC at the first (and, unless ``quick``, the last) write of each kind; ``reference``: an uninterrupted
    run already made (its folder and write counts)."""
    reference_folder, counts = reference or reference_run(work)
    results = []
    for kind in kinds:
        if counts[kind] == 0:
            results.append({"case": kind, "ok": False, "error": "the uninterrupted run made no such write"})
            continue
        for nth in sorted({1} if quick else {1, counts[kind]}):
            name = f"{kind} #{nth}/{counts[kind]}"
            run = work / re.sub(r"\W+", "-", name).strip("-")
            result = _case(name, run, work / f"{run.name}-cache", reference_folder,
                           lambda r, c, log, k=kind, n=nth: _run(r, c, log, k, n))
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


@contextlib.contextmanager
def small_disk(folder: Path, size: int) -> Iterator[Path]:
    """A tmpfs of ``size`` bytes mounted at ``folder`` (root only), unmounted afterwards."""
    if os.geteuid() != 0:
        raise SystemExit("a tmpfs needs root to mount: run as root (or use --mode inject)")
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size // 1024 + 1}k", "tmpfs", str(folder)], check=True)
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], check=False)


def fill_levels(mount: Path, reference: Path, sizes: list[int]) -> list[dict[str, Any]]:
    """The run on ``mount`` with each of ``sizes`` bytes free, then (the filler gone) the same command again."""
    results = []
    for free in sizes:
        filler = _fill(mount, free)
        run, cache = mount / f"run-{free}", mount / f"cache-{free}"
        results.append(_report(_case(f"{free // 1024} KB free", run, cache, reference,
                                     lambda r, c, log: _run(r, c, log), make_room=filler.unlink)))
        shutil.rmtree(run, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
    return results


def footprint(run: Path) -> int:
    return sum(p.stat().st_size for p in run.rglob("*") if p.is_file())


def tmpfs(work: Path, levels: int, quick: bool) -> list[dict[str, Any]]:
    reference, _ = reference_run(work)
    size = footprint(reference)
    levels_free = [0, 4096, 65536, 1 << 20] + [size * i // levels for i in range(1, levels + 1)]
    # the run needs up to four checkpoints at once (best, previous, last and the one being written)
    with small_disk(work / "small", size * 2 + (4 << 20)) as mount:
        return fill_levels(mount, reference, levels_free[:: 3 if quick else 1])


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
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"inject: comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--levels", type=int, default=10, help="tmpfs: free-space levels up to the run's size")
    parser.add_argument("--quick", action="store_true", help="inject: first writes only; tmpfs: every third level")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="gte_pro_disk_full_"))
    work.mkdir(parents=True, exist_ok=True)
    if args.mode == "inject":
        unknown = sorted(set(args.kinds.split(",")) - set(KINDS))
        if unknown:
            raise SystemExit(f"unknown kind(s) {', '.join(unknown)}; the kinds: {', '.join(KINDS)}")
        results = inject(work, args.kinds.split(","), args.quick)
    else:
        results = tmpfs(work, args.levels, args.quick)
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"disk full: {len(results) - len(failed)}/{len(results)} cases ok (work folder {work})"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
