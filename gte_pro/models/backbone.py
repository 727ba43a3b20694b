"""The backbone part of gte-pro's models: a Hugging Face transformer with its tokenizer, as the embedder's ``Encoder``
and the reranker's ``CrossEncoder`` both start from it.

``Backbone.load`` reads the tokenizer and the weights (or builds a random model from ``model.random_init_config``),
and the steps a model opts into change it in place, each with one job: ``set_pooler_aside`` (BERT's unused pooler),
``add_lora`` (``model.lora``), ``memory_switches`` (``model.gradient_checkpointing``, ``model.compile``). The models
take the parts over into their own attributes (``backbone``, ``tokenizer``, ...), so checkpoints and exports name
the same weights as before the split.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from torch import nn
from transformers import PreTrainedTokenizerBase

from gte_pro.models.loading import (
    avoid_cudnn_attention,
    check_trust_remote_code,
    enable_gradient_checkpointing,
    load_tokenizer,
    load_weights,
    random_config,
)
from gte_pro.models.lora import with_lora


@dataclass
class Backbone:
    """A transformer (``model``) and its tokenizer, loaded from ``name_or_path``."""

    name_or_path: str
    tokenizer: PreTrainedTokenizerBase
    model: nn.Module
    # ``model.attn_implementation=null``: the model picks its attention per device at its first pass there
    auto_attention: bool = False
    # BERT's pooler, once set aside (a list: a model that holds it keeps it out of its submodules)
    spare_pooler: list[nn.Module] = field(default_factory=list)
    lora: dict[str, Any] | None = None
    compiled: bool = False

    @classmethod
    def load(
        cls,
        name_or_path: str,
        auto_class: Any,
        *,
        trust_remote_code: bool,
        attn_implementation: str | None,
        random_init_config: dict[str, Any] | None,
        prepare_tokenizer: Callable[[PreTrainedTokenizerBase], None] | None = None,
        **model_options: Any,
    ) -> Backbone:
        """The tokenizer (``prepare_tokenizer`` adjusts it before a random model reads its special tokens) and
        ``auto_class``'s model: ``from_pretrained`` with our refusals, or, with ``random_init_config``, a randomly
        initialised one of that config that shares the named tokenizer (tests, debugging). ``model_options`` go to
        both (e.g. ``num_labels=1``). The model is in training mode (from_pretrained returns eval mode; train with
        dropout like the peers do)."""
        check_trust_remote_code(trust_remote_code)
        name_or_path = str(name_or_path)
        tokenizer = load_tokenizer(name_or_path, trust_remote_code)
        if prepare_tokenizer is not None:
            prepare_tokenizer(tokenizer)
        if random_init_config is not None:
            config = random_config(tokenizer, random_init_config, **model_options)
            model = auto_class.from_config(config, attn_implementation=attn_implementation)
        else:
            model = load_weights(auto_class, name_or_path, trust_remote_code, attn_implementation, **model_options)
        model.train()
        avoid_cudnn_attention()
        return cls(name_or_path, tokenizer, model, auto_attention=attn_implementation is None)

    def set_pooler_aside(self) -> Backbone:
        """BERT's pooler (a dense layer on [CLS]) is not used by any pooling mode here; leaving it in makes DDP
        wait for gradients that never come. It is kept aside (``spare_pooler``: no checkpoint or optimizer sees it)
        for ``Encoder.save`` to put back, so that an export loads without transformers' "pooler ... MISSING"."""
        if isinstance(getattr(self.model, "pooler", None), nn.Module):
            self.spare_pooler.append(self.model.pooler)
            self.model.pooler = None
        return self

    def add_lora(self, lora: dict[str, Any] | None) -> Backbone:
        """``model.lora``: LoRA adapters (peft) around the model; null leaves it as it is."""
        self.lora = dict(lora) if lora else None
        if self.lora:
            self.model = with_lora(self.model, self.lora)
        return self

    def memory_switches(self, gradient_checkpointing: bool, compile: bool) -> Backbone:
        """``model.gradient_checkpointing`` and ``model.compile``. Compiling is in place (nn.Module.compile):
        parameter names, checkpoints and exports stay as without it; dynamic shapes, because dynamic padding gives
        every batch its own length."""
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.model)
        if compile:
            self.model.compile(dynamic=True)
            self.compiled = True
        return self
