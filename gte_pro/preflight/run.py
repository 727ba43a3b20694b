"""The pre-flight of a run: after the config is resolved, before the model's weights load. Given the run's one data
module (or None where it cannot come before the model: ``task=rerank``), it reads the token cache once, through the
module's public interface (``open_token_cache``, ``train_sampler``), and returns its decisions:

- the memory plan per device, printed; a run that does not fit ``trainer.memory_budget`` is refused here, with the
  options that would fit (:class:`gte_pro.preflight.memory_budget.MemoryBudgetError`);
- ``loss.mini_batch_size=auto`` resolved (kept in the run folder, reused on resume); the run puts it in its config
  (``gte_pro.preflight.auto_mini_batch.settle``) before it builds the loss;
- the length chunks the plan assumed for a forward (as the encoder will cut them on this device).

The pre-flight builds nothing of the run: no data module, no model (the model's shape is read on the meta device).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from lightning.fabric.utilities.rank_zero import rank_zero_only

from gte_pro.config.resolve import uses_cuda
from gte_pro.preflight.auto_mini_batch import Choice, announce, is_auto, resolve
from gte_pro.preflight.batch_lengths import DataLengths, batch_lengths
from gte_pro.preflight.memory_budget import (
    MemoryBudgetError,
    budget_of,
    fitting_options,
    judged,
    refusal,
    with_mini_batch,
)
from gte_pro.preflight.memory_estimate import MemoryPlan, estimate, gib, meta_backbone, shape_of
from gte_pro.preflight.per_device import setup_of

log = logging.getLogger(__name__)

NO_ESTIMATE = Choice(None, True, "null (no memory estimate: the model's config cannot be read before it loads; one "
                                 "forward over the batch)")


@dataclass(frozen=True)
class Decisions:
    """What the pre-flight decided for the run."""

    memory: MemoryPlan | None  # the estimate per device (None: the model's config cannot be read before it loads)
    mini_batch: Choice | None  # loss.mini_batch_size=auto resolved (None: the config names a size or null)
    length_chunks: int = 1  # the most length chunks of a forward the plan assumed (1: one padded block)

    def record(self) -> dict[str, Any]:
        """The decisions as ``run_config.json`` keeps them (``resolved``, gte_pro.launch.resume.record_resolved)."""
        mini_batch = {"mini_batch_size": self.mini_batch.value, "mini_batch_why": self.mini_batch.why} \
            if self.mini_batch is not None else {}
        return {**mini_batch, "length_chunks": self.length_chunks}


def preflight(cfg: Any, datamodule: Any | None, run_folder: Path | None = None, resumed: bool = False) -> Decisions:
    """The decisions for ``cfg`` (module docstring); raises :class:`MemoryBudgetError` for a run that does not fit.
    ``datamodule``: the run's own (its token cache is opened here, built where missing); ``run_folder`` keeps the
    mini-batch choice, which a ``resumed`` run reuses.

    The figure judged is the peak of the batches the data will make (``gte_pro.preflight.batch_lengths``: each text's
    length from the token cache, batched by the training sampler, in the encoder's length chunks); every text at
    ``model.max_length`` is printed beside it as the worst case, and judges only where the data's batches cannot be
    read before training (``batch_lengths`` says where)."""
    try:
        shape = shape_of(meta_backbone(cfg.model, str(cfg.task)))
    except (OSError, ValueError) as error:
        log.debug("memory estimate skipped: %s", error)
        return Decisions(None, announce(NO_ESTIMATE) if is_auto(cfg) else None)
    cuda = uses_cuda(cfg)
    data = batch_lengths(cfg, datamodule, cuda) if datamodule is not None else None
    budget, source = budget_of(cfg, cuda)
    setup = setup_of(cfg, cuda, data.datamodule.num_negatives if data is not None else None)
    choice = None
    if is_auto(cfg):
        choice = resolve(cfg, shape, setup, data, (budget, source), run_folder, resumed)
        setup = with_mini_batch(setup, choice.value)  # the setup of the config with the choice settled
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
    memory = replace(plan, full_length_peak=worst.peak) if batch is not None else plan
    return Decisions(memory, choice, _chunks(data))


def _chunks(data: DataLengths | None) -> int:
    return data.chunks if data is not None else 1
