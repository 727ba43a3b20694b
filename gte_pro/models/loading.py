"""Loading a Hugging Face checkpoint for any of gte-pro's models (the embedder's ``Encoder`` and the reranker's
``CrossEncoder``): the tokenizer and weights with the same refusals (remote code, a missing folder or an offline hub
name as a ``MissingModelError`` naming ``model.name_or_path``), the attention fallback, and the memory switches."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

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


def random_config(tokenizer: PreTrainedTokenizerBase, fields: Mapping[str, Any], **extra: Any) -> PretrainedConfig:
    """``model.random_init_config``: the transformers config of a randomly initialised model (tests, debugging) for
    this tokenizer: ``model_type`` (bert unless named: qwen2, modernbert, any transformers architecture), the
    tokenizer's vocabulary size and special-token ids, then ``fields`` (hidden_size, num_hidden_layers, ...). A
    ``vocab_size`` in ``fields`` may exceed the tokenizer's (a real model's embedding matrix, e.g. Qwen2's 151,936
    rows, which dominates a small decoder's memory); a smaller one would leave token ids without a row."""
    fields = dict(fields)
    model_type = str(fields.pop("model_type", "bert"))
    vocab_size = int(fields.pop("vocab_size", None) or len(tokenizer))
    if vocab_size < len(tokenizer):
        raise ConfigError(f"model.random_init_config.vocab_size={vocab_size} is smaller than the tokenizer's "
                          f"{len(tokenizer)} tokens")
    tokens = {f"{name}_token_id": getattr(tokenizer, f"{name}_token_id", None)
              for name in ("pad", "bos", "eos", "cls", "sep")}
    tokens = {key: value for key, value in tokens.items() if value is not None}
    # a BERT tokenizer has no begin/end-of-sequence tokens: its CLS and SEP play their part
    tokens.setdefault("bos_token_id", tokens.get("cls_token_id"))
    tokens.setdefault("eos_token_id", tokens.get("sep_token_id"))
    try:
        return AutoConfig.for_model(model_type, vocab_size=vocab_size, **{**tokens, **extra, **fields})
    except ValueError as err:
        raise ConfigError(f"model.random_init_config.model_type={model_type!r}: {str(err).splitlines()[0]}") from err


def prepare_tokenizer(tokenizer: PreTrainedTokenizerBase, padding_side: str | None, eos: bool) -> None:
    """``model.padding_side`` (left: a decoder embedder's usual batches; null: the tokenizer's own) and
    ``model.append_eos``, as the config check let them through (EncoderSchema's rules)."""
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if eos:
        append_eos(tokenizer)
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        # decoder tokenizers often have no pad token; any id will do under the attention mask, and theirs is EOS
        tokenizer.pad_token = tokenizer.eos_token


def append_eos(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Make every tokenization of a single text end with the tokenizer's end-of-sequence token, as decoder
    embedders (gte-Qwen2, e5-mistral) are trained to read their last token; returns whether it changed anything
    (False when the tokenizer already ends texts with it). The token cache's key covers the tokenizer's
    post-processor, so caches built without it are not reused; exports save the tokenizer with it."""
    from tokenizers import processors

    # a tokenizer without an EOS token (BERT's) ends a text with its separator, which plays that part
    eos, eos_id = ((tokenizer.eos_token, tokenizer.eos_token_id) if tokenizer.eos_token_id is not None
                   else (tokenizer.sep_token, tokenizer.sep_token_id))
    if eos is None or eos_id is None:
        raise ConfigError(f"model.append_eos=true: tokenizer {tokenizer.name_or_path} has no eos_token")
    probe = tokenizer("a")["input_ids"]
    if probe and probe[-1] == eos_id:
        return False
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ConfigError(f"model.append_eos=true needs a fast tokenizer; {tokenizer.name_or_path} is not one")
    head = "$A" if not probe or probe[0] != tokenizer.bos_token_id else f"{tokenizer.bos_token} $A"
    special = [(eos, eos_id)] + ([(tokenizer.bos_token, tokenizer.bos_token_id)] if head != "$A" else [])
    backend.post_processor = processors.TemplateProcessing(single=f"{head} {eos}", pair=f"{head} {eos} $B {eos}",
                                                           special_tokens=special)
    return True


def describe_model(name_or_path: str, random_init_config: Mapping[str, Any] | None) -> str:
    """The model a config loads, as a report names it: its folder or hub name, or with ``random_init_config`` the
    random model it builds, which takes only the tokenizer from ``name_or_path`` (``model=tiny``, ``debug=fast``)."""
    if not random_init_config:
        return str(name_or_path)
    fields = dict(random_init_config)
    return (f"a randomly initialised {fields.get('model_type', 'bert')} ({fields.get('num_hidden_layers', '?')} "
            f"layers, hidden size {fields.get('hidden_size', '?')}) with the tokenizer of {name_or_path}")
