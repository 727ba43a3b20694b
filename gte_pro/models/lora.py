"""LoRA adapters through peft (``model.lora``): only the adapters train; ``gte_pro.models.encoder.Encoder.save``
merges them into a copy of the weights for the exports."""

from __future__ import annotations

from typing import Any

from torch import nn

from gte_pro.errors import ConfigError

LORA_KEYS = {"r": 16, "alpha": 32, "dropout": 0.1, "target_modules": None}
# architectures for which peft names no default targets: their attention's query/key/value projection, the
# counterpart of peft's BERT default (query, value)
DEFAULT_TARGETS = {"modernbert": ["Wqkv"]}


def with_lora(backbone: nn.Module, options: dict[str, Any]) -> nn.Module:
    """``backbone`` with LoRA adapters (peft): only the adapters train. ``options``: ``r``, ``alpha``, ``dropout``,
    ``target_modules`` (null: peft's choice for the architecture, e.g. BERT's query and value projections;
    ModernBERT's Wqkv)."""
    from peft import LoraConfig, get_peft_model

    unknown = sorted(set(options) - set(LORA_KEYS))
    if unknown:
        raise ConfigError(f"model.lora: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(LORA_KEYS)}")
    settings = {**LORA_KEYS, **options}
    target_modules = settings["target_modules"] or DEFAULT_TARGETS.get(getattr(backbone.config, "model_type", ""))
    config = LoraConfig(r=int(settings["r"]), lora_alpha=float(settings["alpha"]),
                        lora_dropout=float(settings["dropout"]), bias="none",
                        target_modules=list(target_modules) if target_modules else None)
    try:
        return get_peft_model(backbone, config)
    except ValueError as error:  # e.g. target modules that the architecture does not have
        raise ConfigError(f"model.lora: {error}") from error
