"""config -> **resolve** -> pre-flight -> build -> mode: what a checked config leaves to the machine it runs on.

A composed config says ``devices: auto``, ``trainer.accelerator: auto``, ``model.length_chunks: auto``,
``loss.teacher_temperature: auto`` and names a strategy; what those come to on this machine and this data (how
many processes, whether they use CUDA, whether the weights are sharded, the temperature the teacher's scores are
read at) is decided here, once per run (:func:`resolve`, from
``gte_pro.modes.build.start_run``, the first step of every mode), said in one log line and recorded in the run
folder's ``run_config.json`` (``resolved``). The pre-flight (``gte_pro.preflight``) and the modes read the answer
(:class:`RunShape`, the settled config) instead of each reading the keys and their fallbacks again. The decisions
that need the data, its tokenizer or the model's shape (``loss.mini_batch_size=auto``, the memory plan, the length
chunks of a forward: :class:`RunShape.length_chunks` with the tokenizer's padding side) are the pre-flight's, on
top of this one, recorded beside it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Any

import torch
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import OmegaConf, read_write

from gte_pro.config.cross_keys import training_file
from gte_pro.launch.environment import device_count
from gte_pro.models.length_chunks import chunks_for
from gte_pro.scoring.teacher_file import settled_temperature

log = logging.getLogger(__name__)

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


@dataclass(frozen=True)
class Resolution:
    """What :func:`resolve` decided for a run."""

    shape: RunShape
    teacher_temperature: float | None  # loss.teacher_temperature as the loss reads it (None: the loss has none)
    teacher_temperature_why: str | None

    def record(self) -> dict[str, Any]:
        """The decisions as ``run_config.json`` keeps them (``resolved``)."""
        return {**self.shape.record(), "teacher_temperature": self.teacher_temperature,
                "teacher_temperature_why": self.teacher_temperature_why}

    def line(self) -> str:
        devices = "auto (judged as 1)" if self.shape.devices is None else self.shape.devices
        fsdp = ", the weights sharded across them (FSDP)" if self.shape.fsdp else ""
        device = "CUDA devices" if self.shape.cuda else "the CPU"
        return (f"resolved: devices={devices} x nodes={self.shape.nodes} = {self.shape.world_size} process(es) on "
                f"{device}{fsdp}")


def resolve(cfg: Any) -> Resolution:
    """Decide what the checked config ``cfg`` leaves open on this machine (module docstring); ``auto`` settings the
    code downstream reads from the config (``loss.teacher_temperature``) are written into it as their values."""
    temperature, why = _teacher_temperature(cfg)
    resolution = Resolution(run_shape(cfg), temperature, why)
    rank_zero_only(log.info)(resolution.line())
    return resolution


def _teacher_temperature(cfg: Any) -> tuple[float | None, str | None]:
    """``loss.teacher_temperature`` as a number, and why; ``auto`` is read from the training file's teacher record
    (``gte_pro.scoring.teacher_file``) and settled into ``cfg``."""
    setting = cfg.loss.get("teacher_temperature")  # only the distillation losses read a teacher's scores
    if setting is None:
        return None, None
    temperature, why = settled_temperature(setting, training_file(cfg))
    with read_write(cfg):  # as a float, whatever was written (1 and 1.0 read the same; the saved config says 1.0)
        cfg.loss.teacher_temperature = temperature
    return temperature, why
