"""A log that holds what a user can act on: third-party chatter a run cannot do anything about is left out.

Left out:
- Lightning's INFO lines: the hardware banner, "💡 Tip" adverts, "`weights_only` was not set", the
  "`Trainer(val_check_interval=1.0)`" note, checkpoint restore notices that our own log already states;
- the model summary table (``trainer.enable_model_summary`` is off; ``gte_pro.modes.fit`` logs the parameter counts);
- known deprecation warnings raised inside our dependencies, and the ``srun`` hint (gte-pro starts SLURM jobs
  itself);
- transformers' "Running in WANDB offline mode", and transformers / sentence-transformers INFO lines and progress
  bars of the export checks.
Lightning's warnings (``rank_zero_warn``) and every message of gte-pro's own loggers still reach the log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import warnings

# logger name -> the lowest level that still reaches the log
QUIET_LOGGERS = {
    "lightning.pytorch": logging.WARNING,
    "lightning.fabric": logging.WARNING,
    "lightning_fabric": logging.WARNING,
    "lightning_utilities": logging.WARNING,
    "sentence_transformers": logging.WARNING,
    "transformers": logging.ERROR,
    "huggingface_hub": logging.WARNING,
    # kept: "Initializing distributed: GLOBAL_RANK: r, MEMBER: r+1/N", the one line per rank that shows a DDP job
    # formed its process group (and which rank is which)
    "lightning.fabric.utilities.distributed": logging.INFO,
}

# warnings raised inside dependencies, about their own internals (message regex)
IGNORED_WARNINGS = (
    r"`isinstance\(treespec, LeafSpec\)` is deprecated",  # lightning's pytree helper on torch >= 2.9
    r"The `srun` command is available on your system but is not used",  # a local run on a SLURM login node
    r"Precision .* is not supported by the model summary",
    r"`is_gradient_checkpointing` is deprecated",  # transformers 5, asked by peft when it wraps a model
    # multi-process validation is exact here: each rank embeds its shard, the sampler's repeated rows are dropped
    # (gte_pro.evaluation.metrics.owned_mask) and the metrics come from every rank's rows merged, the same numbers on
    # every rank, so Lightning's advice to validate on one device or to reduce the logged values does not apply
    r"Using `DistributedSampler` with the dataloaders. During `trainer.validate\(\)`",
    r"It is recommended to use `self.log\('val/.*sync_dist=True\)`",
)


def quiet_third_party() -> None:
    """Apply the filters above (idempotent; every process of a run calls it, DDP children included)."""
    for pattern in IGNORED_WARNINGS:
        warnings.filterwarnings("ignore", message=pattern)
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    from huggingface_hub.utils import disable_progress_bars
    from transformers.utils import logging as transformers_logging

    if os.getenv("WANDB_MODE") == "offline":
        # transformers prints "[INFO] Running in WANDB offline mode" when this module is first imported (the
        # export checks import it through sentence-transformers), whether or not wandb is the logger
        with contextlib.redirect_stdout(io.StringIO()):
            import transformers.integrations.integration_utils  # noqa: F401
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()  # "Loading weights" / "Writing model shards" bars of each export
    disable_progress_bars()
