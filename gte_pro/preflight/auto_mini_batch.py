"""``loss.mini_batch_size=auto``: the GradCache mini-batch (gte_pro.training.gradcache) chosen from the memory plan
(gte_pro.preflight.memory_budget) before the model loads (``gte_pro.preflight.run``).

- the whole batch in one forward (``null``) where its estimated peak fits ``trainer.memory_budget``;
- else the largest mini-batch whose cached step fits (a bisection over 1 .. texts of the step: the estimate grows
  with the mini-batch);
- nothing fits, not even one text per forward: the memory plan's refusal, with the options that would fit;
- ``strategy=fsdp`` (no GradCache there), ``trainer.memory_budget=null`` (no budget to size against) or no estimate
  (the model's config cannot be read before it loads): ``null``, said so.

The choice is one info line, and is kept in the run folder (``mini_batch_size.json``): a resumed run reuses it, so
that it sums the same mini-batches in the same order as the run it continues, even where the budget differs. The
pre-flight returns it; the run puts it in its config (``settle``) before the loss is built.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import open_dict, read_write

from gte_pro.config.resolve import run_shape
from gte_pro.preflight.batch_lengths import DataLengths
from gte_pro.preflight.memory_budget import MemoryBudgetError, fitting_options, judged, refusal, with_mini_batch
from gte_pro.preflight.memory_estimate import ModelShape, Setup, gib
from gte_pro.utils.files import write_json_atomic

log = logging.getLogger(__name__)

AUTO = "auto"
RECORD = "mini_batch_size.json"


@dataclass(frozen=True)
class Choice:
    """What ``auto`` resolves to (None: one forward over the batch), whether it fits, and why, in words."""

    value: int | None
    fits: bool
    why: str


def is_auto(cfg: Any) -> bool:
    return cfg.loss.get("mini_batch_size") == AUTO  # the rerank losses have none


def largest_fitting(fits: Callable[[int], bool], high: int) -> int | None:
    """The largest ``m`` in 1 .. ``high`` with ``fits(m)``, by bisection (``fits`` holds up to some m, then not);
    None where not even 1 fits."""
    if high < 1 or not fits(1):
        return None
    low = 1  # fits(low) holds; every m above ``high`` is not tried
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def choose(peak: Callable[[int | None], float], texts: int, budget: float | None, budget_source: str,
           fsdp: bool) -> Choice:
    """The mini-batch for ``auto`` (module docstring); ``peak(m)``: the estimated peak with ``loss.mini_batch_size=m``
    (None: uncached), ``texts``: the texts of one step on this device."""
    if fsdp:
        return Choice(None, True, "null (strategy=fsdp runs no GradCache: one forward over the batch)")
    if budget is None:
        return Choice(None, True, "null (trainer.memory_budget=null: no budget to size against, one forward over "
                                  "the batch)")
    whole = peak(None)
    of_budget = f"of {gib(budget)} ({budget_source})"
    within = f"within {gib(budget)} ({budget_source})"
    if whole <= budget:
        return Choice(None, True, f"null (the whole batch fits in one forward: estimate {gib(whole)} {of_budget})")
    found = largest_fitting(lambda m: peak(m) <= budget, texts - 1)
    if found is None:
        return Choice(None, False, f"not even 1 text per forward fits {within}: estimate {gib(peak(1))}; the "
                                   f"whole batch in one forward would need {gib(whole)}")
    return Choice(found, True, f"{found} (estimate {gib(peak(found))} {of_budget}; the whole batch in one forward "
                               f"would need {gib(whole)})")


def recorded(run_folder: Path | None) -> Choice | None:
    """The choice a run folder keeps from its first start (None: none kept)."""
    path = run_folder / RECORD if run_folder is not None else None
    if path is None or not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("mini_batch_size")
    shown = "null (one forward over the batch)" if value is None else str(value)
    return Choice(value, True, f"{shown}, as this run chose at its start ({path}): a resumed run sums the same "
                               "mini-batches")


def keep(run_folder: Path | None, choice: Choice) -> None:
    """Write the choice to the run folder (rank 0), for a resumed run to reuse."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    if run_folder is not None and rank_zero_only.rank == 0:
        write_json_atomic(run_folder / RECORD, {"mini_batch_size": choice.value, "why": choice.why})


def resolve(cfg: Any, shape: ModelShape, setup: Setup, data: DataLengths | None, budget: tuple[float | None, str],
            run_folder: Path | None, resumed: bool) -> Choice:
    """``loss.mini_batch_size=auto`` -> the number (or null) the estimate picks, said in one info line; the choice
    kept in the run folder is reused on resume, a new one is kept there. Nothing fits: the refusal, with options."""
    choice = recorded(run_folder) if resumed else None
    if choice is None:
        def peak(mini_batch: int | None) -> float:
            return judged(shape, with_mini_batch(setup, mini_batch), data)[0].peak

        choice = choose(peak, setup.batch_texts or setup.texts, *budget, run_shape(cfg).fsdp)
        if not choice.fits:
            whole = with_mini_batch(setup, None)
            plan, batch = judged(shape, whole, data)
            options = fitting_options(shape, whole, float(budget[0] or 0), cfg, data)
            raise MemoryBudgetError(f"loss.mini_batch_size=auto: {choice.why}\n"
                                    + refusal(plan, float(budget[0] or 0), budget[1], options, batch))
        keep(run_folder, choice)
    return announce(choice)


def announce(choice: Choice) -> Choice:
    """Say the choice (one info line, rank 0)."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    rank_zero_only(log.info)("loss.mini_batch_size=auto: %s", choice.why)
    return choice


def settle(cfg: Any, choice: Choice | None) -> None:
    """Put the resolved value in the config the run builds its loss from (None: ``auto`` was not asked for)."""
    if choice is None:
        return
    with read_write(cfg), open_dict(cfg):
        cfg.loss.mini_batch_size = choice.value
