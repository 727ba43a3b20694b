"""Model soups: the weights of several fine-tunes of one base model, averaged (Wortsman et al. 2022, "Model soups:
averaging weights of multiple fine-tuned models improves accuracy without increasing inference time", ICML).

Two parts, both free of runs and data (``gte_pro.modes.merge`` evaluates and exports):

- ``check_members``: the member folders are model folders of one architecture (config.json's shape keys, the
  sentence-transformers modules and pooling, every tensor's name, dtype and shape from the safetensors headers):
  read before any weight is loaded, so that a mismatch is a two-line error, not a failure halfway through a merge;
- ``encoder_tensors`` / ``load_encoder_tensors``: every tensor an encoder's folder holds, the pooler that
  ``Encoder`` sets aside included (never trained, so equal in fine-tunes of one base, but a tensor of the folder);
- the weight arithmetic on state dicts: ``uniform`` (the mean of every floating tensor; a non-float tensor must be
  equal in every member) and ``slerp`` (spherical interpolation of two members, tensor by tensor).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig

from gte_pro.errors import MissingModelError, ModelMismatchError
from gte_pro.models.encoder import Encoder

# config.json keys that decide the architecture and the tensors' shapes (dropout, names and versions do not)
SHAPE_KEYS = ("model_type", "architectures", "hidden_size", "num_hidden_layers", "num_attention_heads",
              "num_key_value_heads", "intermediate_size", "vocab_size", "max_position_embeddings", "type_vocab_size",
              "hidden_act", "position_embedding_type", "tie_word_embeddings")
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2")
# |cos| of two tensors above which slerp falls back to linear interpolation (the angle is too small to divide by)
PARALLEL = 0.9995
# the names of the set-aside pooler's tensors among an encoder's (``encoder_tensors``)
POOLER = "pooler_set_aside."


def _json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def safetensors_header(path: Path) -> dict[str, tuple[str, tuple[int, ...]]]:
    """Name -> (dtype, shape) of every tensor of a safetensors file, from its header alone (no weight is read)."""
    with path.open("rb") as handle:
        size = int.from_bytes(handle.read(8), "little")
        header = json.loads(handle.read(size))
    header.pop("__metadata__", None)
    return {name: (entry["dtype"], tuple(entry["shape"])) for name, entry in header.items()}


def shape_config(folder: Path) -> dict[str, Any]:
    """config.json's shape keys, with transformers' defaults for the keys a file leaves out (versions of
    transformers write different keys for one architecture); the file as written when transformers cannot read it
    (a model whose configuration class lives in its hub repository)."""
    raw = _json(folder / "config.json")
    try:
        config = AutoConfig.from_pretrained(str(folder)).to_dict()
    except (ValueError, OSError, KeyError):
        config = raw
    return {key: config.get(key) for key in SHAPE_KEYS if key in config or key in raw}


def st_layout(folder: Path) -> dict[str, Any]:
    """What the sentence-transformers files say about the model's shape: its modules' types, the pooling modes that
    are on and the pooled dimension (other keys vary between sentence-transformers versions)."""
    modules, pooling = folder / "modules.json", folder / "1_Pooling" / "config.json"
    layout: dict[str, Any] = {}
    if modules.is_file():
        layout["modules.json"] = [module.get("type") for module in _json(modules)]
    if pooling.is_file():
        flags = _json(pooling)
        layout["pooling"] = sorted(key for key, value in flags.items()
                                   if key.startswith("pooling_mode") and value is True)
        layout["pooled dimension"] = flags.get("word_embedding_dimension")
    return layout


def member_layout(folder: Path) -> dict[str, Any]:
    """What must be equal across members: config.json's shape keys, the sentence-transformers files and every
    floating tensor's (dtype, shape), keyed ``<file>:<tensor>``. ``MissingModelError`` naming the folder when it is
    not a model folder (no config.json, no safetensors weights)."""
    config_file = folder / "config.json"
    hint = "give the model/ folder of a finished run (<run dir>/model): a sentence-transformers folder on this machine"
    if not folder.is_dir():
        raise MissingModelError(f"merge.models: {folder} is not a folder", hint=hint)
    if not config_file.is_file():
        raise MissingModelError(f"merge.models: {folder} is not a model folder (no config.json)", hint=hint)
    weights = sorted(folder.rglob("*.safetensors"))
    if not weights:
        raise MissingModelError(f"merge.models: {folder} is not a model folder (no *.safetensors weights)", hint=hint)
    config = shape_config(folder)
    # floating tensors only: an integer buffer (BERT's position_ids) is in the files of some transformers versions and
    # not in others; the loaded encoders' own non-float tensors are held equal after loading (check_buffers)
    tensors = {f"{path.relative_to(folder)}:{name}": entry
               for path in weights for name, entry in safetensors_header(path).items() if entry[0] in FLOAT_DTYPES}
    return {"config": config,
            "files": st_layout(folder),
            "tensors": tensors}


def _first_difference(first: Mapping[str, Any], other: Mapping[str, Any]) -> str | None:
    for key in sorted(set(first) | set(other)):
        if key not in other:
            return f"{key} is missing"
        if key not in first:
            return f"{key} is not in the first member"
        if first[key] != other[key]:
            return f"{key} is {other[key]!r}, the first member's is {first[key]!r}"
    return None


def check_members(folders: Sequence[Path]) -> None:
    """Every member has the first member's architecture and tensors (read from config.json, the sentence-transformers
    files and the safetensors headers; no weight is loaded); ``ModelMismatchError`` naming the first difference."""
    layouts = [member_layout(folder) for folder in folders]
    for folder, layout in zip(folders[1:], layouts[1:], strict=True):
        for part, what in (("config", "config.json"), ("files", "sentence-transformers files"),
                           ("tensors", "tensors")):
            difference = _first_difference(layouts[0][part], layout[part])
            if difference:
                raise ModelMismatchError(f"merge.models: {folder} and {folders[0]} differ in their {what}: "
                                         f"{difference}")


def encoder_tensors(encoder: Encoder) -> dict[str, torch.Tensor]:
    """A CPU copy of every tensor of ``encoder`` that its saved folder holds: its state dict and the pooler set
    aside (``POOLER``-prefixed)."""
    state = dict(encoder.state_dict())
    for pooler in encoder._spare_pooler:
        state.update({POOLER + key: tensor for key, tensor in pooler.state_dict().items()})
    return {key: tensor.detach().cpu().clone() for key, tensor in state.items()}


def load_encoder_tensors(encoder: Encoder, state: Mapping[str, torch.Tensor]) -> None:
    """``encoder_tensors``' inverse: load ``state`` into ``encoder`` (strict: every tensor, no other)."""
    encoder.load_state_dict({key: tensor for key, tensor in state.items() if not key.startswith(POOLER)})
    for pooler in encoder._spare_pooler:
        pooler.load_state_dict({key.removeprefix(POOLER): tensor for key, tensor in state.items()
                                if key.startswith(POOLER)})


def check_buffers(states: Sequence[Mapping[str, torch.Tensor]], names: Sequence[str]) -> None:
    """Same tensor names in every state, and every non-float tensor (position ids, ...) equal in all of them: a
    non-float tensor cannot be averaged."""
    for state, name in zip(states[1:], names[1:], strict=True):
        if set(state) != set(states[0]):
            missing = sorted(set(states[0]) ^ set(state))[0]
            raise ModelMismatchError(f"merge.models: {name} and {names[0]} differ in their tensors: {missing}")
        for key, tensor in state.items():
            if not tensor.is_floating_point() and not torch.equal(tensor, states[0][key]):
                raise ModelMismatchError(f"merge.models: {name} and {names[0]} differ in the non-float tensor "
                                         f"{key}, which cannot be averaged")


def uniform(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The uniform soup: every floating tensor the mean of the members' (summed in float64, cast back to its dtype);
    a non-float tensor the first member's (``check_buffers`` holds them equal)."""
    soup = {}
    for key, first in states[0].items():
        if first.is_floating_point():
            total = sum(state[key].double() for state in states)
            soup[key] = (total / len(states)).to(first.dtype)
        else:
            soup[key] = first.clone()
    return soup


def slerp_tensor(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """Spherical interpolation from ``a`` (t=0) to ``b`` (t=1) along the great circle of the two flattened tensors
    (Shoemake 1985): sin((1-t)w)/sin(w) a + sin(tw)/sin(w) b, w the angle between them; linear interpolation when
    they are near-parallel (|cos w| > PARALLEL) or one is zero, where sin(w) is too small to divide by."""
    x, y = a.double().flatten(), b.double().flatten()
    norms = x.norm() * y.norm()
    cosine = float(x @ y / norms) if norms > 0 else 1.0
    if abs(cosine) > PARALLEL:
        mixed = (1 - t) * x + t * y
    else:
        omega = math.acos(max(-1.0, min(1.0, cosine)))
        mixed = (math.sin((1 - t) * omega) * x + math.sin(t * omega) * y) / math.sin(omega)
    return mixed.reshape(a.shape).to(a.dtype)


def slerp(states: Sequence[Mapping[str, torch.Tensor]], t: float) -> dict[str, torch.Tensor]:
    """Two members' spherical interpolation, tensor by tensor (a non-float tensor: the first member's)."""
    first, second = states
    return {key: slerp_tensor(tensor, second[key], t) if tensor.is_floating_point() else tensor.clone()
            for key, tensor in first.items()}
