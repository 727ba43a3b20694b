"""The memory estimate (:mod:`gte_pro.preflight.memory_estimate`) judged against what one device may use: the budget,
the plan of the data's largest batch, the refusal of a run that does not fit and the options that would
(``gte_pro.preflight.run`` prints and applies them before the model loads), and what ``metrics.json`` keeps.

``trainer.memory_budget``: ``auto`` (the GPU's memory; on the CPU the machine's RAM shared by the ``devices``
processes), a number of GiB, or ``null`` (print the estimate, never refuse).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from typing import Any

import torch

from gte_pro.config.resolve import run_shape
from gte_pro.errors import ConfigError
from gte_pro.preflight.batch_lengths import DataLengths
from gte_pro.preflight.memory_estimate import (
    GIB,
    MemoryPlan,
    ModelShape,
    Setup,
    activation_bytes,
    estimate,
    gib,
    with_lora_shape,
)

Change = Callable[[ModelShape, Setup], tuple[ModelShape, Setup] | None]


class MemoryBudgetError(ConfigError):
    """The composed run needs more memory per device than it may use."""

    hint = "add one of the options above to the command, or trainer.memory_budget=null to start anyway"


def budget_of(cfg: Any, cuda: bool) -> tuple[float | None, str]:
    """The bytes one device may use, and where that figure comes from."""
    value = cfg.trainer.memory_budget
    if value is None or value is False:
        return None, "trainer.memory_budget=null"
    if value != "auto":  # a number of GiB (gte_pro.config.checks has checked it)
        return float(value) * GIB, f"trainer.memory_budget={value}"
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return float(props.total_memory), f"{props.name}'s memory"
    import psutil

    processes = run_shape(cfg).devices or 1  # devices=auto: the plan judges one device's share
    share = f" / {processes} processes" if processes > 1 else ""
    return psutil.virtual_memory().total / processes, f"this machine's RAM{share}"


def with_mini_batch(setup: Setup, mini_batch: int | None) -> Setup:
    """``setup`` under ``loss.mini_batch_size=mini_batch`` (None: one forward over the batch)."""
    if not mini_batch:
        return replace(setup, texts=setup.batch_texts or setup.texts, mini_batch=None)
    return replace(setup, texts=min(setup.batch_texts or setup.texts, mini_batch), mini_batch=mini_batch)


def judged(shape: ModelShape, setup: Setup, data: DataLengths | None) -> tuple[MemoryPlan, str | None]:
    """The plan of ``setup`` for the data's largest step (and that step in words), or with every text at full
    length where ``data`` is None (and None)."""
    if data is None:
        return estimate(shape, setup), None

    def cost(pieces: tuple[tuple[int, int], ...]) -> float:
        return activation_bytes(shape, replace(setup, pieces=pieces))

    pieces, batch = data.largest(cost, setup.rows, setup.mini_batch)
    if not pieces:
        return estimate(shape, setup), None
    return estimate(shape, replace(setup, pieces=pieces)), batch


def refusal(plan: MemoryPlan, budget: float, source: str, options: list[tuple[str, float]],
            batch: str | None = None) -> str:
    """The message of a run that does not fit (one line a part: the CLI joins them with '; ')."""
    largest = f" for its largest batch ({batch})" if batch else ""
    lines = [f"this run needs about {gib(plan.peak)} per device{largest}, more than {gib(budget)} ({source}) "
             f"[estimate, docs/models.md#memory: {plan.parts()}]"]
    if options:
        lines.append("options that fit (estimated peak):")
        lines += [f"{overrides} ({gib(peak)})" for overrides, peak in options]
    else:
        lines.append("no option or pair of options here fits: a shorter model.max_length, or more devices")
    return "\n".join(lines)


def _changes(shape: ModelShape, setup: Setup, cfg: Any) -> dict[str, Change]:
    """The overrides that lower the memory, each as a change of the estimate's inputs (None: not applicable)."""
    batch = int(cfg.data.batch_size)
    per_row = max((setup.batch_texts or setup.texts) // max(batch, 1), 1)
    changes: dict[str, Change] = {
        "model.gradient_checkpointing=true":
            lambda m, s: None if s.checkpointing else (m, replace(s, checkpointing=True)),
        "model.lora='{r: 16}'": lambda m, s: None if s.lora else (with_lora_shape(m), replace(s, lora=True)),
    }
    if setup.cuda and "32" in setup.precision:
        changes["precision=bf16-mixed"] = lambda m, s: (m, replace(s, precision="bf16-mixed"))
    for mini_batch in (32, 8):
        changes[f"loss.mini_batch_size={mini_batch}"] = (
            lambda m, s, n=mini_batch: None if s.texts <= n or s.shards > 1 else (
                m, replace(s, texts=n, mini_batch=n)))
    for devices in (2, 4, 8):
        if setup.cuda and torch.cuda.device_count() >= devices:
            changes[f"strategy=fsdp devices={devices}"] = lambda m, s, n=devices: (m, replace(s, shards=n))
    for smaller in (batch // 2, batch // 4):
        if smaller >= 1:
            changes[f"data.batch_size={smaller}"] = lambda m, s, b=smaller: (m, smaller_batch(s, b, per_row))
    return changes


def smaller_batch(setup: Setup, rows: int, per_row: int) -> Setup:
    """``setup`` at ``rows`` rows per step: fewer texts per forward, embeddings and score cells (queries x
    candidates: both scale with the rows)."""
    scale = rows / max(setup.rows, 1)
    return replace(setup, texts=min(setup.texts, rows * per_row), rows=rows, batch_texts=rows * per_row,
                   score_cells=round(setup.score_cells * scale * scale))


def fitting_options(shape: ModelShape, setup: Setup, budget: float, cfg: Any, data: DataLengths | None = None,
                    most: int = 6) -> list[tuple[str, float]]:
    """Single overrides that fit, else pairs of them, each with its estimated peak (at most ``most``): for the
    data's largest batch under the override where ``data`` is given."""
    changes = _changes(shape, setup, cfg)
    for size in (1, 2):
        found = []
        for names in combinations(changes, size):
            if size == 2 and names[0].split("=")[0] == names[1].split("=")[0]:
                continue  # two values of one key
            state: tuple[ModelShape, Setup] | None = (shape, setup)
            for name in names:
                state = changes[name](*state) if state else None
            if state is not None and (peak := judged(*state, data)[0].peak) <= budget:
                found.append((" ".join(names), peak))
        if found:
            return found[:most]
    return []


def memory_record(plan: MemoryPlan | None) -> dict[str, Any] | None:
    """What metrics.json keeps: the estimate by part (GiB), and on a GPU the measured peak of allocated memory beside
    it (PyTorch's allocator: the CUDA context is not in it)."""
    if plan is None:
        return None
    record = {name: round(value / GIB, 3) for name, value in vars(plan).items() if name != "cached"}
    record["estimated_peak"] = round(plan.peak / GIB, 3)
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        record["measured_peak_allocated"] = round(torch.cuda.max_memory_allocated() / GIB, 3)
    return record
