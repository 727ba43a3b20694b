"""The embedder's head: what turns the backbone's token states into the embedding (``EmbeddingHead``: pooling, an
optional projection head, L2 normalisation). The projection head sits on top of pooling (``model.projection``; the
original GTE-Pro recipe's hidden -> 512 -> ReLU -> dropout -> 512), or is read back from a sentence-transformers
folder's ``Dense`` modules."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from gte_pro.errors import ConfigError
from gte_pro.models.pooling import POOLING_MODES, detect_pooling

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


@dataclass
class EmbeddingHead:
    """Pooling mode, projection head (None: none) and normalisation: the embedding is
    ``normalize(projection(pool(token states)))``. ``Encoder`` takes them over as its ``pooling``, ``projection``
    (a submodule: its weights are ``projection.*`` in checkpoints) and ``normalize``."""

    pooling: str
    normalize: bool
    projection: nn.Sequential | None = None
    projection_settings: dict[str, Any] | None = None  # model.projection, as configured (the model card shows it)

    @classmethod
    def build(cls, name_or_path: str, hidden: int, *, pooling: str | None, normalize: bool | None,
              projection: dict[str, Any] | None, read_files: bool) -> EmbeddingHead:
        """The head on a backbone of width ``hidden``. ``read_files`` (a checkpoint, not a random model): a null
        ``pooling`` or ``normalize`` is what ``name_or_path``'s sentence-transformers files declare (so that a
        fine-tune keeps the geometry its checkpoint was trained with), and without ``projection`` a folder's Dense
        modules are the head. Otherwise mean pooling, normalised."""
        detected_pooling, detected_normalize = detect_pooling(name_or_path) if read_files else (None, None)
        settings = dict(projection) if projection else None
        # a sentence-transformers folder with Dense modules (an exported run with a head) brings its own
        layers = build_projection(hidden, projection) if projection else None
        if layers is None and read_files:
            layers = load_dense_head(name_or_path)
        mode = pooling or detected_pooling or "mean"
        if mode not in POOLING_MODES:
            raise ConfigError(f"model.pooling={mode!r} is not valid; valid choices: {', '.join(POOLING_MODES)}")
        if normalize is None:
            normalize = detected_normalize if detected_normalize is not None else True
        return cls(mode, bool(normalize), layers, settings)
