"""`make reliability`: every fault case of the project, or a seeded random selection of them (what CI runs).

    python scripts/reliability.py                                  # every case, full size (an hour or more)
    python scripts/reliability.py --select 2 --quick --seed 7      # CI: two random cases, small; the seed is printed
    python scripts/reliability.py --cases faults-ddp,storm         # these cases
    python scripts/reliability.py --list

The cases:

- ``faults-<variant>`` (base, workers, hard-negatives, ddp): kill -9 at random moments and inside checkpoint and
  export writes, SIGTERM and SIGINT at random moments; every restart continues, and the run ends bit-identical to
  an uninterrupted one (scripts/fault_injection.py).
- ``storm``: one SLURM job (2 DDP tasks) preempted at random moments (signal, requeue, during start-up), ending
  bit-identical to an undisturbed job (scripts/preemption_storm.py). Needs a SLURM cluster
  (`bash scripts/local_slurm.sh start`); without one it is left out of a selection, and named on its own it fails.
- ``run-lock``: the same command started twice at once into one run folder: one trains, the other is refused at
  once naming the holder, and the finished run equals a run that was alone.
- ``cache-*``: two processes building one token cache, corpus store or tokenizer at once, and damaged caches
  (scripts/cache_faults.py, when present).
- ``disk-full-inject``: a full disk (ENOSPC) at the first and the last write of each kind that a training run,
  ``mode=mine``, ``mode=score`` and ``task=rerank`` make (log, lock, records, caches, CSV logger, best and last
  checkpoints, exports, metrics, curves; the mined file, the score shards and the scored file, their reports): each
  ends in the two-line error with exit code 2, and the same command afterwards ends bit-identical to an
  uninterrupted run (scripts/disk_full.py; quick: one kind per mode drawn by the seed, first writes only).
- ``write-faults``: kill -9 and SIGTERM at the first and the last write of each kind of each mode (train, mine,
  score, rerank; scripts/disk_full.py --fault): the killed run restarts, the stopped one exits 143, and the same
  command ends bit-identical to an uninterrupted run (quick: one mode and one kind per fault, drawn by the seed).
- ``disk-full-tmpfs``: the same on a real tmpfs filled to levels from nothing free to the run's whole size (the
  disk fills inside whatever write comes then). Needs root and a machine that lets it mount a tmpfs; without them
  it is left out of a selection.

Each case prints one line (ok or FAILED, seconds, what it checked); the exit code is 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import disk_full  # noqa: E402
import fault_injection  # noqa: E402
import preemption_storm  # noqa: E402

Case = Callable[[Path, int, bool], dict[str, Any]]


def slurm_up() -> bool:
    if not shutil.which("sinfo"):
        return False
    probe = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=30)
    return probe.returncode == 0 and any(s.startswith(("idle", "mix", "alloc")) for s in probe.stdout.split())


def faults_case(variant: str) -> Case:
    def case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
        kills = 2 if quick else 20  # quick: a kill -9 at a random time and a SIGTERM, in one run
        fault_injection.hard_negatives_file(work)
        result = fault_injection.run_variant(variant, kills, 2 if quick else 5, work, work / "cache",
                                             random.Random(seed), timeout=600.0)
        ok = result["identical"] == result["same_metrics"] == result["runs"] > 0
        moments = ", ".join(f"{k} {n}" for k, n in sorted(result["by_kind"].items()))
        return {"ok": ok, "detail": f"{result['kills']} faults ({moments}), {result['runs']} finished runs, "
                                    f"{result['identical']} bit-identical, {result['same_metrics']} same metrics",
                "result": result}
    return case


def storm_case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
    preemptions = 3 if quick else 10
    result = preemption_storm.storm(work, preemptions, steps=300 if quick else 500, devices=2, seed=seed,
                                    timeout=1500.0 if quick else 3600.0)
    ok = result["identical_weights"] and result["same_metrics"] and result["slurm_restarts"] == preemptions
    moments = ", ".join(event["moment"] for event in result["moments"])
    return {"ok": ok, "detail": f"{preemptions} preemptions ({moments}); SLURM restarts {result['slurm_restarts']}, "
                                f"resumed from steps {result['resumed_steps']}; weights "
                                f"{'identical' if result['identical_weights'] else 'DIFFERENT'}, metrics "
                                f"{'equal' if result['same_metrics'] else 'DIFFERENT'}", "result": result}


def run_lock_case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
    """Two starts of one folder at once (a requeue racing a resubmit): exactly one trains, the other exits 2 at once
    naming the holder; the folder then holds one run, equal to the same command run alone."""
    cache = work / "cache"
    overrides = [*fault_injection.BASE, "trainer.max_epochs=1"]
    alone = work / "alone"
    if fault_injection._start(alone, overrides, cache, "none", 0, work / "alone.log").wait(timeout=600) != 0:
        raise RuntimeError(f"the run alone failed, see {work / 'alone.log'}")
    shared = work / "shared"
    procs = [fault_injection._start(shared, overrides, cache, "none", 0, work / f"racer{i}.log") for i in range(2)]
    codes = [proc.wait(timeout=600) for proc in procs]
    refused = [i for i, code in enumerate(codes) if code == 2]
    logs = [(work / f"racer{i}.log").read_text(errors="replace") for i in range(2)]
    named = bool(refused) and "is in use by another run" in logs[refused[0]] and "process" in logs[refused[0]]
    same_weights, same_metrics = fault_injection.identical(shared, alone) if sorted(codes) == [0, 2] else (False,
                                                                                                          False)
    ok = sorted(codes) == [0, 2] and named and same_weights and same_metrics
    return {"ok": ok, "detail": f"exit codes {codes}; the refusal names the holder: {named}; the folder's run equals "
                                f"the run alone: weights {same_weights}, metrics {same_metrics}"}


def disk_full_inject_case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
    results = []
    for task in disk_full.TASKS:  # train, mine, score, rerank; quick: one kind of write each, drawn by the seed
        folder = work / task
        folder.mkdir()
        reference = disk_full.reference_run(folder, task)
        written = [kind for kind, count in reference[1].items() if count]
        kinds = sorted(random.Random(seed).sample(written, 1)) if quick else written
        results += disk_full.inject(folder, kinds, quick, reference, task)
    return _disk_full_outcome(results)


def write_faults_case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
    """kill -9 and SIGTERM at each kind of write of each mode (quick: one mode and one kind per fault, drawn)."""
    rng, results = random.Random(seed), []
    for fault in ("kill", "sigterm"):
        for task in [rng.choice(list(disk_full.TASKS))] if quick else list(disk_full.TASKS):
            folder = work / f"{fault}-{task}"
            folder.mkdir()
            reference = disk_full.reference_run(folder, task)
            written = [kind for kind, count in reference[1].items() if count]
            kinds = [rng.choice(written)] if quick else written
            results += disk_full.inject(folder, kinds, quick, reference, task, fault)
    failed = [r["case"] for r in results if not r["ok"]]
    return {"ok": not failed, "detail": f"{len(results)} faults at writes ({', '.join(r['case'] for r in results)}): "
                                        f"{len(results) - len(failed)} stopped as expected and resumed bit-identical"
                                        + (f"; FAILED: {', '.join(failed)}" if failed else ""), "results": results}


def disk_full_tmpfs_case(work: Path, seed: int, quick: bool) -> dict[str, Any]:
    return _disk_full_outcome(disk_full.tmpfs(work, levels=10, quick=quick))


def _disk_full_outcome(results: list[dict[str, Any]]) -> dict[str, Any]:
    failed = [r["case"] for r in results if not r["ok"]]
    named = sum(r.get("exit") == 2 for r in results)
    return {"ok": not failed, "detail": f"{len(results)} full disks ({', '.join(r['case'] for r in results)}): "
                                        f"{named} named errors with exit 2, {len(results) - named} fitted; "
                                        f"{len(results) - len(failed)} reruns bit-identical"
                                        + (f"; FAILED: {', '.join(failed)}" if failed else ""), "results": results}


def cache_cases() -> dict[str, Case]:
    """scripts/cache_faults.py's ``case_<name>(seed)`` functions as ``cache-<name>`` cases, when that file exists."""
    try:
        import cache_faults
    except ImportError:
        return {}

    def wrap(function: Callable[..., dict[str, Any]]) -> Case:
        return lambda work, seed, quick: function(seed)

    return {"cache-" + name[len("case_"):].replace("_", "-").removeprefix("cache-"): wrap(getattr(cache_faults, name))
            for name in sorted(dir(cache_faults)) if name.startswith("case_")}


def all_cases() -> dict[str, tuple[Case, str | None]]:
    """name -> (the case, what it needs that a machine may lack: "SLURM", "a tmpfs" (root, mount allowed) or None)."""
    cases: dict[str, tuple[Case, str | None]] = {f"faults-{v}": (faults_case(v), None)
                                                 for v in fault_injection.VARIANTS}
    cases["storm"] = (storm_case, "SLURM")
    cases["run-lock"] = (run_lock_case, None)
    cases.update({name: (case, None) for name, case in cache_cases().items()})
    cases["disk-full-inject"] = (disk_full_inject_case, None)
    cases["disk-full-tmpfs"] = (disk_full_tmpfs_case, "a tmpfs")
    cases["write-faults"] = (write_faults_case, None)
    return cases


def available() -> set[str]:
    """What this machine has of what some cases need."""
    return {need for need, present in (("SLURM", slurm_up()), ("a tmpfs", disk_full.can_mount())) if present}


def choose(cases: dict[str, tuple[Case, str | None]], names: str, select: int | None, seed: int,
           present: set[str]) -> tuple[list[str], list[str]]:
    """(the cases to run, those left out for want of what they need)."""
    if names != "all":
        wanted = names.split(",")
        unknown = [n for n in wanted if n not in cases]
        if unknown:
            raise SystemExit(f"unknown case(s) {', '.join(unknown)}; the cases: {', '.join(cases)}")
        return wanted, []
    runnable = [n for n, (_, need) in cases.items() if need is None or need in present]
    left_out = [n for n in cases if n not in runnable]
    if select is not None:
        runnable = sorted(random.Random(seed).sample(runnable, min(select, len(runnable))))
    return runnable, left_out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="all", help="comma-separated case names (default: all)")
    parser.add_argument("--select", type=int, default=None, help="run this many cases drawn at random (seeded)")
    parser.add_argument("--seed", type=int, default=None, help="the draw's and the cases' seed (default: random)")
    parser.add_argument("--quick", action="store_true", help="small cases (CI): fewer kills and preemptions")
    parser.add_argument("--work", type=Path, default=None, help="folder for the runs (default: a temporary one)")
    parser.add_argument("--json", type=Path, default=None, help="write every case's result here")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    args = parser.parse_args()
    cases = all_cases()
    if args.list:
        print("\n".join(f"{n}{f' (needs {need})' if need else ''}" for n, (_, need) in cases.items()))
        return
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10_000)
    names, left_out = choose(cases, args.cases, args.select, seed, available())
    print(f"reliability: seed {seed}; cases: {', '.join(names)}"
          + (f"; left out (this machine lacks what they need): {', '.join(left_out)}" if left_out else "")
          + f" (again: python scripts/reliability.py --cases {','.join(names)} --seed {seed}"
          + (" --quick" if args.quick else "") + ")", flush=True)
    work = args.work or Path(tempfile.mkdtemp(prefix="gte_pro_reliability_"))
    results = []
    for name in names:
        started = time.monotonic()
        folder = work / name
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        try:
            outcome = cases[name][0](folder, seed, args.quick)
        except Exception as error:  # a case that cannot finish is a failed case, reported with the others
            outcome = {"ok": False, "detail": f"{type(error).__name__}: {error}"}
        outcome = {"case": name, "seconds": round(time.monotonic() - started, 1), **outcome}
        results.append(outcome)
        print(f"{name}: {'ok' if outcome['ok'] else 'FAILED'} in {outcome['seconds']} s: {outcome['detail']}",
              flush=True)
    if args.json:
        args.json.write_text(json.dumps({"seed": seed, "results": results}, indent=2, default=str))
    failed = [r["case"] for r in results if not r["ok"]]
    print(f"reliability: {len(results) - len(failed)}/{len(results)} cases ok (work folder {work})"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
