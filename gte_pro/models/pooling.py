"""Pooling: token states -> one vector per text (``pool``), and the pooling and normalisation a model's
sentence-transformers files declare (``detect_pooling``, what ``model.pooling=null`` reads)."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from gte_pro.errors import ConfigError

POOLING_MODES = ("mean", "cls", "last")
_ST_POOLING_KEYS = {
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_cls_token": "cls",
    "pooling_mode_lasttoken": "last",
}
_ST_POOLING_NAMES = {"mean": "mean", "cls": "cls", "lasttoken": "last"}


def pool(hidden: torch.Tensor, attention_mask: torch.Tensor, mode: str) -> torch.Tensor:
    """Reduce token states ``(B, T, H)`` to one vector per text, ignoring padding."""
    if mode == "cls":
        return hidden[:, 0]
    if mode == "mean":
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    if mode == "last":
        # the last real token of each row, with left or right padding: the first 1 of the mask read backwards
        last = attention_mask.shape[1] - 1 - attention_mask.flip(1).argmax(1)
        return hidden[torch.arange(hidden.shape[0], device=hidden.device), last]
    raise ConfigError(f"unknown pooling mode {mode!r}; valid choices: {', '.join(POOLING_MODES)}")


def _read_json(path: Path) -> dict | list | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def _sentence_transformers_file(name_or_path: str, filename: str) -> Path | None:
    """A file of the sentence-transformers layout, from a local folder or the hub cache (never raises)."""
    local = Path(name_or_path) / filename
    if local.exists():
        return local
    if Path(name_or_path).exists():
        return None
    try:
        from huggingface_hub import hf_hub_download

        return Path(hf_hub_download(name_or_path, filename))
    except Exception:  # offline, missing file, private repo: fall back to config values
        return None


def detect_pooling(name_or_path: str) -> tuple[str | None, bool | None]:
    """(pooling mode, normalize) declared by the model's sentence-transformers files, or None each."""
    pooling = None
    pooling_file = _sentence_transformers_file(name_or_path, "1_Pooling/config.json")
    settings = _read_json(pooling_file) if pooling_file else None
    if isinstance(settings, dict):
        # sentence-transformers < 6 writes one boolean per mode; 6.x writes "pooling_mode": "mean"
        pooling = next((mode for key, mode in _ST_POOLING_KEYS.items() if settings.get(key)), None)
        pooling = pooling or _ST_POOLING_NAMES.get(str(settings.get("pooling_mode")))
    normalize = None
    modules_file = _sentence_transformers_file(name_or_path, "modules.json")
    modules = _read_json(modules_file) if modules_file else None
    if isinstance(modules, list):
        normalize = any(str(m.get("type", "")).endswith("Normalize") for m in modules)
    return pooling, normalize
