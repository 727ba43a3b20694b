"""Before a run loads its model: the memory estimate per device (:mod:`gte_pro.preflight.memory_estimate`), printed,
and a refusal with the options that would fit when it is more than ``trainer.memory_budget`` allows.

``trainer.memory_budget``: ``auto`` (the GPU's memory; on the CPU the machine's RAM shared by the ``devices``
processes), a number of GiB, or ``null`` (print the estimate, never refuse). ``loss.mini_batch_size=auto`` is
resolved here, from the same estimate (gte_pro.preflight.auto_mini_batch).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only

from gte_pro.errors import ConfigError
from gte_pro.preflight.auto_mini_batch import Choice, choose, is_auto, keep, recorded, settle
from gte_pro.preflight.batch_lengths import DataLengths, data_lengths
from gte_pro.preflight.memory_estimate import (
    GIB,
    MemoryPlan,
    ModelShape,
    Setup,
    activation_bytes,
    estimate,
    gib,
    meta_backbone,
    shape_of,
    with_lora_shape,
)
from gte_pro.preflight.per_device import setup_of

log = logging.getLogger(__name__)

Change = Callable[[ModelShape, Setup], tuple[ModelShape, Setup] | None]


class MemoryBudgetError(ConfigError):
    """The composed run needs more memory per device than it may use."""

    hint = "add one of the options above to the command, or trainer.memory_budget=null to start anyway"


def uses_cuda(cfg: Any) -> bool:
    accelerator = str(cfg.trainer.get("accelerator", "auto"))
    return accelerator in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def budget_of(cfg: Any, cuda: bool) -> tuple[float | None, str]:
    """The bytes one device may use, and where that figure comes from."""
    value = cfg.trainer.get("memory_budget", "auto")
    if value is None or value is False:
        return None, "trainer.memory_budget=null"
    if value != "auto":  # a number of GiB (gte_pro.config.checks has checked it)
        return float(value) * GIB, f"trainer.memory_budget={value}"
    if cuda:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        return float(props.total_memory), f"{props.name}'s memory"
    import psutil

    processes = max(int(cfg.get("devices", 1)), 1)
    share = f" / {processes} processes" if processes > 1 else ""
    return psutil.virtual_memory().total / processes, f"this machine's RAM{share}"


def plan_memory(cfg: Any, run_folder: Path | None = None, resumed: bool = False) -> MemoryPlan | None:
    """Print the estimate; raise :class:`MemoryBudgetError` when it does not fit. None when the model's config cannot
    be read here (the model's loading then says why). ``loss.mini_batch_size=auto`` is resolved first, in ``cfg``
    (kept in ``run_folder``, and reused from it where the run is ``resumed``).

    The figure judged is the peak of the batches the data will make (``gte_pro.preflight.batch_lengths``: each text's
    length from the token cache, batched by the training sampler, in the encoder's length chunks); every text at
    ``model.max_length`` is printed beside it as the worst case, and judges only where the data's batches cannot be
    read before training (``data_lengths`` says where)."""
    try:
        shape = shape_of(meta_backbone(cfg.model, str(cfg.get("task", "embed"))))
    except (OSError, ValueError) as error:
        log.debug("memory estimate skipped: %s", error)
        if is_auto(cfg):
            settle(cfg, Choice(None, True, "null (no memory estimate: the model's config cannot be read before it "
                                           "loads; one forward over the batch)"))
        return None
    cuda = uses_cuda(cfg)
    data = data_lengths(cfg, cuda)
    budget, source = budget_of(cfg, cuda)
    if is_auto(cfg):
        resolve_auto(cfg, shape, setup_of(cfg, cuda, _negatives(data)), data, (budget, source), run_folder, resumed)
    setup = setup_of(cfg, cuda, _negatives(data))
    worst = estimate(shape, setup)
    plan, batch = judged(shape, setup, data)
    of_budget = f" of {gib(budget)} ({source})" if budget else ""
    say = rank_zero_only(log.info)
    if batch is None:
        say("memory per device (estimated, %d texts x %d tokens per forward): %s%s; %s", setup.texts,
            setup.tokens_per_text, gib(plan.peak), of_budget, plan.parts())
    else:
        say("memory per device (estimated for this data's largest batch, %s): %s%s; %s; at full length (the worst "
            "case, %d texts x %d tokens per forward): %s", batch, gib(plan.peak), of_budget, plan.parts(),
            setup.texts, setup.tokens_per_text, gib(worst.peak))
    if budget is not None and plan.peak > budget:
        options = fitting_options(shape, setup, budget, cfg, data)
        raise MemoryBudgetError(refusal(plan, budget, source, options, batch))
    if budget is not None and worst.peak > budget and batch is not None:
        rank_zero_only(log.warning)(
            "memory: starting, as this data's largest batch (%s) needs about %s per device, within %s (%s); "
            "%d texts of %d tokens each would need %s", batch, gib(plan.peak), gib(budget), source, setup.texts,
            setup.tokens_per_text, gib(worst.peak))
    return replace(plan, full_length_peak=worst.peak) if batch is not None else plan


def _negatives(data: DataLengths | None) -> int | None:
    return data.datamodule.num_negatives if data is not None else None


def with_mini_batch(setup: Setup, mini_batch: int | None) -> Setup:
    """``setup`` under ``loss.mini_batch_size=mini_batch`` (None: one forward over the batch)."""
    if not mini_batch:
        return replace(setup, texts=setup.batch_texts or setup.texts, mini_batch=None)
    return replace(setup, texts=min(setup.batch_texts or setup.texts, mini_batch), mini_batch=mini_batch)


def resolve_auto(cfg: Any, shape: ModelShape, setup: Setup, data: DataLengths | None,
                 budget: tuple[float | None, str], run_folder: Path | None, resumed: bool) -> None:
    """``loss.mini_batch_size=auto`` -> the number (or null) the estimate picks (gte_pro.preflight.auto_mini_batch),
    set in ``cfg``; the choice kept in the run folder is reused on resume. Nothing fits: the refusal, with options."""
    choice = recorded(run_folder) if resumed else None
    if choice is None:
        def peak(mini_batch: int | None) -> float:
            return judged(shape, with_mini_batch(setup, mini_batch), data)[0].peak

        fsdp = str(cfg.get("strategy", {}).get("_target_", "") or "").endswith("FSDPStrategy")
        choice = choose(peak, setup.batch_texts or setup.texts, *budget, fsdp)
        if not choice.fits:
            whole = with_mini_batch(setup, None)
            plan, batch = judged(shape, whole, data)
            options = fitting_options(shape, whole, float(budget[0] or 0), cfg, data)
            raise MemoryBudgetError(f"loss.mini_batch_size=auto: {choice.why}\n"
                                    + refusal(plan, float(budget[0] or 0), budget[1], options, batch))
        keep(run_folder, choice)
    settle(cfg, choice)


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
