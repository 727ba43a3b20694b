"""``loss.guide`` judged before any model loads (``gte_pro.config.checks.config_problems``): a folder that exists, or
a hub name this machine can read, holding an embedder; read from its ``config.json`` and ``modules.json`` alone, no
weights. A cross-encoder (a sequence-classification checkpoint: a reranker) scores pairs, not texts, and cannot be
a guide; ``loss.guide_margin`` without a guide, or a guide of an InfoNCE term weighted 0, would do nothing."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from gte_pro.config.cross_keys import DISTILL_LOSSES, Problem

GUIDE_FIX = ("give loss.guide an embedder's folder or hub name (a sentence-transformers or Hugging Face embedding "
             "model, e.g. loss.guide=sentence-transformers/all-MiniLM-L6-v2), or loss.guide=null")


def guide_problems(cfg: DictConfig) -> list[str]:
    """The problems of ``loss.guide`` and ``loss.guide_margin`` together, one line each (a guide that is not a string
    is named by the key's own rule)."""
    guide = OmegaConf.select(cfg, "loss.guide", default=None, throw_on_missing=False)
    margin = OmegaConf.select(cfg, "loss.guide_margin", default=None, throw_on_missing=False)
    if guide is None:
        if isinstance(margin, int | float) and not isinstance(margin, bool) and margin != 0:
            return [f"loss.guide_margin={margin}: set but loss.guide is null; give the guide (loss.guide=<embedder>) "
                    "or drop the margin"]
        return []
    if not isinstance(guide, str) or not guide.strip():
        return []
    problems = []
    if (problem := guide_model_problem(guide)) is not None:
        problems.append(Problem(f"loss.guide={guide}: {problem}", fix=GUIDE_FIX))
    loss = DISTILL_LOSSES.get(str(OmegaConf.select(cfg, "loss._target_", default="", throw_on_missing=False)))
    if loss is not None and OmegaConf.select(cfg, "loss.weight_infonce", default=None, throw_on_missing=False) == 0:
        problems.append(f"loss.guide={guide}: loss={loss} with loss.weight_infonce=0 has no in-batch term for the "
                        "guide to mask; set loss.weight_infonce > 0 or loss.guide=null")
    return problems


def _looks_local(name: str) -> bool:
    """A path rather than a hub name (``org/name``), as ``gte_pro.models.loading`` reads ``model.name_or_path``."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or os.sep != "/" and os.sep in name


def _hub_file(name: str, filename: str) -> Path | None:
    """``filename`` of hub model ``name`` in the local Hugging Face cache, or None."""
    from huggingface_hub import try_to_load_from_cache

    try:
        found = try_to_load_from_cache(name, filename)
    except ValueError:  # not a valid repository id
        return None
    return Path(found) if isinstance(found, str) else None


def guide_model_problem(name: str) -> str | None:
    """What keeps ``name`` from being a guide, or None: a missing folder, a hub name that cannot be read offline,
    a folder without a model's ``config.json``, a cross-encoder."""
    folder = Path(name).expanduser()
    if folder.exists():
        if not folder.is_dir():
            return "not a folder (a guide is a model folder or a hub name)"
        config, modules = folder / "config.json", folder / "modules.json"
        if not config.is_file():
            return f"not a model folder (no {config})"
    elif _looks_local(name):
        return f"no such folder ({folder.absolute()})"
    else:
        config, modules = _hub_file(name, "config.json"), _hub_file(name, "modules.json")
        if config is None:
            if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
                return "neither a folder nor a hub model in the local cache (HF_HUB_OFFLINE=1 reads the cache only)"
            return None  # downloaded when the guide loads
    return _cross_encoder(config, modules)


def _read(path: Path | None) -> Any:
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _cross_encoder(config_path: Path, modules_path: Path | None) -> str | None:
    config = _read(config_path)
    if not isinstance(config, dict):
        return f"{config_path} is not a model's config (no JSON object)"
    classifiers = [a for a in config.get("architectures") or [] if str(a).endswith("ForSequenceClassification")]
    modules = _read(modules_path)
    cross = [m.get("type") for m in modules if isinstance(m, dict) and "cross" in str(m.get("type")).lower()] \
        if isinstance(modules, list) else []
    if classifiers or cross:
        what = ", ".join(map(str, classifiers + cross))
        return (f"a cross-encoder ({what}: it scores (query, document) pairs), not an embedder; a guide embeds "
                "texts. A reranker judges mined negatives through mode=mine mine.rescore_with=...")
    return None
