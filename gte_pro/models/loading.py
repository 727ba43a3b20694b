"""Loading a Hugging Face checkpoint for any of gte-pro's models (the embedder's ``Encoder`` and the reranker's
``CrossEncoder``): the tokenizer and weights with the same refusals (remote code, a missing folder or an offline hub
name as a ``MissingModelError`` naming ``model.name_or_path``), the attention fallback, and the memory switches."""

from __future__ import annotations

import logging
from typing import Any

import torch
from torch import nn
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from gte_pro.errors import ConfigError, MissingModelError

log = logging.getLogger(__name__)


def refuse_remote_code(error: Exception, name_or_path: str, trust_remote_code: bool) -> None:
    """transformers' refusal to run a repository's code, in terms of our config key."""
    if "trust_remote_code" in str(error) and not trust_remote_code:
        raise ConfigError(f"{name_or_path}: this model's code lives in its hub repository and would run on this "
                         "machine; set model.trust_remote_code=true to allow it") from error


def check_trust_remote_code(value: Any) -> None:
    if not isinstance(value, bool):
        # a string "false" is true: only a real boolean may decide whether hub code runs on this machine
        raise ConfigError(f"model.trust_remote_code={value!r} is not valid; valid choices: true, false")


def load_tokenizer(name_or_path: str, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    try:
        return AutoTokenizer.from_pretrained(name_or_path, trust_remote_code=trust_remote_code)
    except ValueError as err:
        refuse_remote_code(err, name_or_path, trust_remote_code)
        raise
    except OSError as err:  # no such folder, or a hub name that is not in the cache while offline
        looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1
        why = "no such folder" if looks_local else str(err).splitlines()[0]
        raise MissingModelError(f"model.name_or_path={name_or_path}: {why}") from err


def load_weights(auto_class: Any, name_or_path: str, trust_remote_code: bool, attn_implementation: str | None,
                 **options: Any) -> nn.Module:
    """``auto_class.from_pretrained`` with our refusals; a model that does not support ``attn_implementation``
    falls back to its default attention, with a warning."""
    kwargs: dict[str, Any] = {"trust_remote_code": trust_remote_code, **options}
    if attn_implementation:
        kwargs["attn_implementation"] = attn_implementation
    try:
        return auto_class.from_pretrained(name_or_path, **kwargs)
    except (ValueError, ImportError) as err:
        refuse_remote_code(err, name_or_path, trust_remote_code)
        if "attn_implementation" not in kwargs or "attn" not in str(err).lower():
            raise
        log.warning("%s does not support attn_implementation=%s; using the default", name_or_path,
                    attn_implementation)
        kwargs.pop("attn_implementation")
        return auto_class.from_pretrained(name_or_path, **kwargs)


def avoid_cudnn_attention() -> None:
    """Take cuDNN out of PyTorch's SDPA backends (process-wide; flash, memory-efficient and math remain).

    With a padding mask, torch 2.11 on Hopper sends ``scaled_dot_product_attention`` to cuDNN first, and cuDNN
    builds an execution plan for every (rows, length) shape it has not seen (0.4-0.5 s each, forward and
    backward). Dynamic padding and length chunks make nearly every pass a new shape: on an H200 a MiniLM step
    took ~1 s (28 samples/s at batch 32) where the compute is milliseconds. The memory-efficient kernel takes the
    same mask with no per-shape planning."""
    disable = getattr(torch.backends.cuda, "enable_cudnn_sdp", None)  # torch >= 2.4
    if disable is not None:
        disable(False)


def enable_gradient_checkpointing(model: nn.Module) -> None:
    """Recompute each layer's activations in backward: less memory for a large batch, ~30% more compute;
    non-reentrant checkpointing restores the RNG, so dropout masks match the forward pass."""
    enable = getattr(model, "activation_checkpointing_enable", None)  # transformers >= 5.x name
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
