"""A projection head on top of pooling (``model.projection``; the original GTE-Pro recipe's hidden -> 512 -> ReLU ->
dropout -> 512), and reading one back from a sentence-transformers folder's ``Dense`` modules."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from torch import nn

from gte_pro.errors import ConfigError

log = logging.getLogger(__name__)


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


PROJECTION_KEYS = {"dims": None, "activation": "relu", "dropout": 0.1}
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "tanh": nn.Tanh, "identity": nn.Identity}


def build_projection(hidden: int, options: dict[str, Any]) -> nn.Sequential:
    """Linear layers of ``options["dims"]`` on top of pooling, each but the last followed by the activation and
    dropout: ``{dims: [512, 512], activation: relu, dropout: 0.1}`` is hidden -> 512 -> ReLU -> dropout -> 512."""
    unknown = sorted(set(options) - set(PROJECTION_KEYS))
    if unknown:
        raise ConfigError(f"model.projection: unknown key(s) {', '.join(unknown)}; valid keys: "
                         f"{', '.join(PROJECTION_KEYS)}")
    settings = {**PROJECTION_KEYS, **options}
    dims = list(settings["dims"] or [])
    if not dims or any(not isinstance(d, int) or d < 1 for d in dims):
        raise ConfigError(f"model.projection.dims={settings['dims']!r}: expected a list of positive integers, "
                         "e.g. [512, 512]")
    if settings["activation"] not in ACTIVATIONS:
        raise ConfigError(f"model.projection.activation={settings['activation']!r} is not valid; valid choices: "
                         f"{', '.join(ACTIVATIONS)}")
    layers: list[nn.Module] = []
    for index, (width_in, width_out) in enumerate(zip([hidden, *dims], dims, strict=False)):
        layers.append(nn.Linear(width_in, width_out))
        if index < len(dims) - 1:
            layers += [ACTIVATIONS[settings["activation"]](), nn.Dropout(float(settings["dropout"]))]
    return nn.Sequential(*layers)


def load_dense_head(name_or_path: str) -> nn.Sequential | None:
    """The Dense modules of a local sentence-transformers folder (modules.json), as a head of Linear layers and
    their activations with the folder's weights; None when it has none."""
    modules = _json_file(Path(name_or_path) / "modules.json")
    if not isinstance(modules, list):
        return None
    dense = [m for m in modules if str(m.get("type", "")).endswith("Dense")]
    layers: list[nn.Module] = []
    for entry in dense:
        folder = Path(name_or_path) / entry["path"]
        config = _json_file(folder / "config.json") or {}
        linear = nn.Linear(config["in_features"], config["out_features"], bias=config.get("bias", True))
        from safetensors.torch import load_file

        weights = load_file(str(folder / "model.safetensors"))
        linear.load_state_dict({key.removeprefix("linear."): value for key, value in weights.items()})
        activation = str(config.get("activation_function", "torch.nn.modules.activation.Tanh")).rsplit(".", 1)[-1]
        kinds = {kind.__name__: kind for kind in ACTIVATIONS.values()}
        if activation not in kinds:
            raise ConfigError(f"{folder / 'config.json'}: activation_function {activation} is not supported; "
                             f"supported: {', '.join(kinds)}")
        layers += [linear] + ([kinds[activation]()] if activation != "Identity" else [])
    if layers:
        log.info("%s: %d Dense module(s) loaded as the projection head", name_or_path, len(dense))
    return nn.Sequential(*layers) if layers else None
