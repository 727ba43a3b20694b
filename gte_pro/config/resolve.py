"""config -> **resolve** -> pre-flight -> build -> mode: what a checked config leaves to the machine it runs on.

A composed config says ``devices: auto``, ``trainer.accelerator: auto``, ``model.length_chunks: auto`` and names a
strategy; what those come to on this machine (how many processes, whether they use CUDA, whether the weights are
sharded, how many length chunks a forward runs in) is decided here, once, and the pre-flight
(``gte_pro.preflight``) and the modes read the answer (:class:`RunShape`) instead of each reading the keys and
their fallbacks again. The decisions that need the data or the model's shape (``loss.mini_batch_size=auto``, the
memory plan) are the pre-flight's, on top of this one.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import torch
from omegaconf import OmegaConf

from gte_pro.launch.environment import device_count
from gte_pro.models.length_chunks import chunks_for

FSDP_SUFFIX = "FSDPStrategy"  # gte_pro.launch.fsdp.FSDPStrategy, or Lightning's own


@dataclass(frozen=True)
class RunShape:
    """Where and how the run's processes run, as this machine resolves the config."""

    devices: int | None  # processes per node (None: ``devices=auto`` or -1, as many as the machine has)
    nodes: int
    cuda: bool  # the trainer's accelerator is a CUDA device here
    fsdp: bool  # the weights are sharded across the processes (strategy=fsdp)

    @property
    def world_size(self) -> int:
        """Processes of the run (1 where ``devices`` is auto: an estimate judges one device's share)."""
        return max((self.devices or 1) * self.nodes, 1)

    @property
    def device_type(self) -> str:
        return "cuda" if self.cuda else "cpu"

    def length_chunks(self, setting: int | str, compiled: bool, padding_side: str) -> int:
        """The most length chunks of a forward on this device (``model.length_chunks``): one padded block under
        ``model.compile``, left padding or FSDP, as gte_pro.models.encoder and gte_pro.launch.fsdp cut them."""
        if compiled or padding_side != "right" or self.fsdp:
            return 1
        return chunks_for(setting, self.device_type)

    def record(self) -> dict[str, Any]:
        return {**asdict(self), "world_size": self.world_size}


def strategy_target(cfg: Any) -> str:
    """The ``_target_`` of the config's strategy ("" for ``strategy=auto``, which names none)."""
    return str(OmegaConf.select(cfg, "strategy._target_", default="") or "")


def uses_fsdp(cfg: Any) -> bool:
    return strategy_target(cfg).endswith(FSDP_SUFFIX)


def uses_cuda(cfg: Any) -> bool:
    """Whether the trainer's accelerator (``trainer.accelerator``) resolves to a CUDA device on this machine."""
    return str(cfg.trainer.accelerator) in ("auto", "gpu", "cuda") and torch.cuda.is_available()


def run_shape(cfg: Any) -> RunShape:
    """The :class:`RunShape` of the checked config ``cfg`` on this machine."""
    return RunShape(devices=device_count(cfg.devices), nodes=int(cfg.nodes), cuda=uses_cuda(cfg), fsdp=uses_fsdp(cfg))
