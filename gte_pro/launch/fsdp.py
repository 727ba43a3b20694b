"""``strategy=fsdp``: Lightning's FullyShardedDataParallel, with each transformer layer its own shard unit, on GPUs and
(gloo) on the CPU.

Two things Lightning's own class leaves to the user:

- what to wrap: without an ``auto_wrap_policy`` the whole model is one flat parameter, gathered whole for every
  forward, so a model that does not fit one device still does not fit. Hugging Face names the blocks that must not be
  split (``_no_split_modules``: ``Qwen2DecoderLayer``, ``ModernBertEncoderLayer``, ``BertLayer``, ...); each of them
  becomes one FSDP unit, as ``accelerate``'s transformer policy does.
- the CPU: Lightning refuses FSDP without a GPU for its own class only (``type(strategy) is FSDPStrategy``), yet
  torch's FSDP runs on gloo; that is how the tests check, on 2 CPU processes, that FSDP trains like DDP.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from lightning.pytorch.strategies import FSDPStrategy as LightningFSDP

log = logging.getLogger(__name__)


def no_split_layer_classes(model: torch.nn.Module) -> set[type[torch.nn.Module]]:
    """The classes of the blocks that every Hugging Face model inside ``model`` declares unsplittable."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return {type(module) for module in model.modules() if type(module).__name__ in names}


def layer_policy(model: torch.nn.Module) -> Any:
    """Each transformer block a unit; with LoRA (frozen weights beside trainable ones), each trainable leaf module
    (an adapter) a unit of its own too, as peft's ``fsdp_auto_wrap_policy`` does: a unit that mixes the two keeps
    gradient buffers for its frozen weights, and the tiny adapters would all land on one rank's shard."""
    import functools

    from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _or_policy, lambda_auto_wrap_policy

    layers = no_split_layer_classes(model)
    if not layers:
        return None
    blocks = ModuleWrapPolicy(layers)
    if all(p.requires_grad for p in model.parameters()):
        return blocks

    def trainable_leaf(module: torch.nn.Module) -> bool:
        own = list(module.parameters(recurse=False))
        return not list(module.children()) and bool(own) and all(p.requires_grad for p in own)

    adapters = functools.partial(lambda_auto_wrap_policy, lambda_fn=trainable_leaf)
    return functools.partial(_or_policy, policies=[adapters, blocks])


def one_forward_per_batch(model: torch.nn.Module) -> None:
    """FSDP gathers each block inside every forward, so the ranks must run the same number of forwards: a batch is
    not cut into length chunks (``model.length_chunks``), whose number depends on each rank's own texts."""
    for module in model.modules():
        if getattr(module, "length_chunks", 1) != 1:
            log.info("strategy=fsdp: model.length_chunks=%s -> 1 (every rank must run the same forwards)",
                     module.length_chunks)
            module.length_chunks = 1


class FSDPStrategy(LightningFSDP):
    """Lightning's FSDP; ``auto_wrap_policy: null`` (the default) wraps each transformer layer on its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # kept out of self.kwargs: Lightning drops (with a warning) a policy given for a model that is wrapped already
        self._wrap_policy = self.kwargs.pop("auto_wrap_policy", None)
        self._wrapped: tuple[torch.nn.Module, torch.nn.Module] | None = None

    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        # Wrapping changes the module in place (its layers become FSDP units, its parameters views into flat shards),
        # so the validation before training and the fit after it must share one wrapper
        if self._wrapped is not None and self._wrapped[0] is model:
            return self._wrapped[1]
        policy = self._wrap_policy if self._wrap_policy is not None else layer_policy(model)
        one_forward_per_batch(model)
        # Lightning passes device_id=None on the CPU, which torch's FSDP reads as "find an accelerator"
        device = self.root_device if self.root_device.type == "cpu" else self.root_device.index
        model = FullyShardedDataParallel(module=model, cpu_offload=self.cpu_offload,
                                         mixed_precision=self.mixed_precision_config,
                                         sharding_strategy=self.sharding_strategy, device_id=device,
                                         auto_wrap_policy=policy, **self.kwargs)
        wrapped = super()._setup_model(model)  # wrapped: Lightning only finishes the set-up
        self._wrapped = (model.module, wrapped)
        return wrapped

    # --- checkpoints: Lightning's full state dicts, without the CPU offload on the CPU ------------------------------
    def _full_state_dict_context(self) -> Any:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp.api import FullOptimStateDictConfig

        # "offload to the CPU" of tensors already there frees the storage it then hands back (a segfault in clone)
        offload = self.root_device.type != "cpu"
        return FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT,
                                    FullStateDictConfig(offload_to_cpu=offload, rank0_only=True),
                                    FullOptimStateDictConfig(offload_to_cpu=offload, rank0_only=True))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self._state_dict_type != "full" or self.root_device.type != "cpu":
            return super().lightning_module_state_dict()
        with self._full_state_dict_context():
            return self.model.state_dict()

    def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if self._state_dict_type != "full" or self.root_device.type != "cpu":
            return super().optimizer_state(optimizer)
        optimizer = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer wraps the torch one
        with self._full_state_dict_context():
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard layout, as Lightning stores it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state


def is_sharded(trainer: Any) -> bool:
    """Whether ``trainer`` trains with FSDP (its module's parameters are then shards, not weights)."""
    return isinstance(getattr(trainer, "strategy", None), LightningFSDP)


def unsharded_module(trainer: Any, module: torch.nn.Module,
                     rebuild: Callable[[], torch.nn.Module]) -> torch.nn.Module | None:
    """The trained weights in a plain module on rank 0 (None on the other ranks; every rank must call this: it
    gathers the shards), for the exports; ``module`` itself when ``trainer`` does not shard."""
    if not is_sharded(trainer):
        return module
    state_dict = trainer.strategy.lightning_module_state_dict()  # the full weights, on rank 0 only
    if not trainer.is_global_zero:
        return None
    plain = rebuild()
    plain.load_state_dict(state_dict)
    return plain
