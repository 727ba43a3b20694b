"""Writing a trained encoder in the layouts other tools load offline: sentence-transformers, plain Hugging Face
(+ the pooling code its README documents) and ONNX. Each is written to a temporary sibling and renamed into place,
so a crash never leaves half an export where a previous one was.

The sentence-transformers layout written here is the classic one (modules.json + 1_Pooling [+ N_Dense per layer of
the projection head] + N_Normalize), which every sentence-transformers release from 2.x to 6.x reads.
"""

from __future__ import annotations

import json
import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gte_pro.models.encoder import Encoder
from gte_pro.models.heads import ACTIVATIONS
from gte_pro.utils.files import write_atomic

log = logging.getLogger(__name__)

_ST_POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
}


def _write_json(path: Path, blob: object) -> None:
    """A config file inside an export's temporary folder (the folder as a whole is swapped in atomically)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob, indent=2) + "\n")


def export_sentence_transformers(encoder: Encoder, folder: str | Path) -> Path:
    """Write ``encoder`` so that ``SentenceTransformer(folder)`` reproduces its embeddings.

    Written to a sibling temp folder first and renamed, so that a crash never leaves a half-written model where
    a previous export was.
    """
    folder = Path(folder)
    write_atomic(folder, lambda tmp: _write_sentence_transformers(encoder, tmp))
    log.info("exported sentence-transformers model to %s", folder)
    return folder


def _write_sentence_transformers(encoder: Encoder, tmp: Path) -> None:
    encoder.save(tmp)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    for linear, activation in projection_layers(encoder):  # model.projection: one Dense module per linear layer
        idx = len(modules)
        _write_dense(tmp / f"{idx}_Dense", linear, activation)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Dense",
                        "type": "sentence_transformers.models.Dense"})
    if encoder.normalize:
        idx = len(modules)
        modules.append({"idx": idx, "name": str(idx), "path": f"{idx}_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
        (tmp / f"{idx}_Normalize").mkdir(parents=True, exist_ok=True)
    _write_json(tmp / "modules.json", modules)
    _write_json(tmp / "sentence_bert_config.json", {"max_seq_length": encoder.max_length, "do_lower_case": False})
    pooling = {flag: False for flag in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                        "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                        "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")}
    pooling[_ST_POOLING_FLAGS[encoder.pooling]] = True
    _write_json(tmp / "1_Pooling" / "config.json",
                {"word_embedding_dimension": encoder.hidden_dim, **pooling, "include_prompt": True})
    prompts = {"query": encoder.query_prefix, "document": encoder.doc_prefix}
    _write_json(tmp / "config_sentence_transformers.json",
                {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})


def projection_layers(encoder: Encoder) -> list[tuple[nn.Linear, nn.Module]]:
    """The projection head as (linear layer, the activation after it) pairs; dropout is inactive at inference."""
    if encoder.projection is None:
        return []
    linears = [(i, m) for i, m in enumerate(encoder.projection) if isinstance(m, nn.Linear)]
    pairs = []
    for i, linear in linears:
        follower = encoder.projection[i + 1] if i + 1 < len(encoder.projection) else nn.Identity()
        pairs.append((linear, follower if not isinstance(follower, nn.Dropout | nn.Linear) else nn.Identity()))
    return pairs


def _write_dense(folder: Path, linear: nn.Linear, activation: nn.Module) -> None:
    """sentence-transformers' Dense layout: config.json and model.safetensors (``linear.weight``/``.bias``)."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    kind = type(activation)
    _write_json(folder / "config.json", {"in_features": linear.in_features, "out_features": linear.out_features,
                                         "bias": linear.bias is not None,
                                         "activation_function": f"{kind.__module__}.{kind.__name__}"})
    weights = {"linear.weight": linear.weight.detach().float().cpu().contiguous()}
    if linear.bias is not None:
        weights["linear.bias"] = linear.bias.detach().float().cpu().contiguous()
    save_file(weights, str(folder / "model.safetensors"))


# --- plain Hugging Face layout ---------------------------------------------------------------------------------
POOLING_FILE = "gte_pro_pooling.json"

# The pooling code that <hf>/README.md documents. hf_embedder runs this very code, so the verification of the HF
# export also proves the documentation right (one copy of the pooling logic outside gte_pro.models.encoder).
HF_POOLING_CODE = """import json, torch, torch.nn.functional as F
from transformers import AutoModel, AutoTokenizer

folder = {folder!r}
settings = json.load(open(f"{{folder}}/{pooling_file}"))
tokenizer, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()

def embed(texts):
    batch = tokenizer(list(texts), padding=True, truncation=True, max_length=settings["max_length"],
                      return_tensors="pt")
    with torch.inference_mode():
        hidden = model(**batch).last_hidden_state
    mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
    if settings["pooling"] == "mean":
        emb = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
    elif settings["pooling"] == "cls":
        emb = hidden[:, 0]
    else:  # "last": the last real token, with left or right padding
        mask = batch["attention_mask"]
        emb = hidden[torch.arange(len(hidden)), mask.shape[1] - 1 - mask.flip(1).argmax(1)]
    if settings.get("projection"):  # the projection head: linear layers, each followed by its activation
        from safetensors.torch import load_file
        head = load_file(f"{{folder}}/{{settings['projection_file']}}")
        act = {{"relu": torch.relu, "gelu": F.gelu, "tanh": torch.tanh, "identity": lambda x: x}}
        for i, layer in enumerate(settings["projection"]):
            emb = act[layer["activation"]](emb @ head[f"{{i}}.weight"].T + head[f"{{i}}.bias"])
    return F.normalize(emb, dim=-1) if settings["normalize"] else emb
"""

_HF_README = """# Plain Hugging Face layout

Backbone and tokenizer as `save_pretrained` writes them. The embedding is the backbone's last hidden state,
pooled and normalised as `{pooling_file}` says (pooling `{pooling}`, normalize `{normalize}`, max_length
{max_length}, query prefix {query_prefix!r}, document prefix {doc_prefix!r}):

```python
{code}
embeddings = embed(["a query", "a document"])
```
"""


PROJECTION_FILE = "gte_pro_projection.safetensors"


def _activation_name(module: nn.Module) -> str:
    return next(name for name, kind in ACTIVATIONS.items() if isinstance(module, kind))


def pooling_settings(encoder: Encoder) -> dict[str, Any]:
    settings = {"pooling": encoder.pooling, "normalize": encoder.normalize, "max_length": encoder.max_length,
                "query_prefix": encoder.query_prefix, "doc_prefix": encoder.doc_prefix, "dim": encoder.dim}
    layers = projection_layers(encoder)
    if layers:
        settings["projection"] = [{"activation": _activation_name(act)} for _, act in layers]
        settings["projection_file"] = PROJECTION_FILE
    return settings


def export_hf(encoder: Encoder, folder: str | Path) -> Path:
    """``save_pretrained`` of backbone and tokenizer, ``gte_pro_pooling.json`` and a README with the pooling code."""
    folder = Path(folder)
    write_atomic(folder, lambda tmp: _write_hf(encoder, tmp))
    log.info("exported Hugging Face model to %s", folder)
    return folder


def _write_hf(encoder: Encoder, tmp: Path) -> None:
    encoder.save(tmp)
    settings = pooling_settings(encoder)
    _write_json(tmp / POOLING_FILE, settings)
    layers = projection_layers(encoder)
    if layers:
        from safetensors.torch import save_file

        weights = {}
        for i, (linear, _) in enumerate(layers):
            weights[f"{i}.weight"] = linear.weight.detach().float().cpu().contiguous()
            weights[f"{i}.bias"] = linear.bias.detach().float().cpu().contiguous()
        save_file(weights, str(tmp / PROJECTION_FILE))
    code = HF_POOLING_CODE.format(folder=".", pooling_file=POOLING_FILE)
    (tmp / "README.md").write_text(_HF_README.format(pooling_file=POOLING_FILE, code=code, **settings))


def export_adapter(encoder: Encoder, folder: str | Path) -> Path:
    """``model.lora``: the LoRA adapter alone (peft layout), next to the merged exports."""
    folder = Path(folder)
    write_atomic(folder, encoder.save_adapter)
    log.info("exported the LoRA adapter to %s", folder)
    return folder


# --- ONNX --------------------------------------------------------------------------------------------------------
class _OnnxGraph(nn.Module):
    """Backbone + pooling + normalisation with positional inputs, as the ONNX graph computes them."""

    def __init__(self, encoder: Encoder) -> None:
        super().__init__()
        self.encoder = encoder

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask)


# attention implementations the TorchScript exporter traces into plain ONNX ops (flash / flex kernels have none)
_TRACEABLE_ATTENTION = ("sdpa", "eager")


@contextmanager
def _traceable_attention(encoder: Encoder) -> Iterator[None]:
    """The backbone on sdpa while it is traced (it computes what flash_attention_2 does, on padded tensors), then
    back to what it ran on."""
    backbone = encoder.backbone
    previous = backbone.config._attn_implementation
    if previous in _TRACEABLE_ATTENTION:
        yield
        return
    backbone.set_attn_implementation("sdpa")
    try:
        yield
    finally:
        backbone.set_attn_implementation(previous)


def export_onnx(encoder: Encoder, path: str | Path, opset: int = 17) -> Path:
    """One ONNX graph (inputs ``input_ids``, ``attention_mask``; output ``embeddings``) with dynamic batch and
    sequence axes; pooling settings go into the model's metadata. Needs ``onnx`` (``pip install -e '.[export]'``).

    The graph is the module's forward pass, so a decoder's causal mask, left padding's position ids (counted from
    the mask) and last-token pooling (found from the mask: either padding side) are in it; a ModernBERT's local
    attention window too. The tokenizer (exported with the model: padding side, EOS) and the instruction stay
    outside, as with every layout.
    """
    path = write_atomic(path, lambda tmp: _write_onnx(encoder, tmp, opset), suffix=".onnx")
    log.info("exported ONNX model to %s", path)
    return path


def _write_onnx(encoder: Encoder, tmp: Path, opset: int) -> None:
    import onnx

    was_training = encoder.training
    encoder.eval()
    # trace with a padded batch: traced on a batch without padding, the attention mask could drop out of the graph
    sample = encoder.tokenize(["a short text", "a longer text, so that the short one above gets padded"])
    device = next(encoder.parameters()).device
    args = (sample["input_ids"].to(device), sample["attention_mask"].to(device))
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "sequence"},
            "embeddings": {0: "batch"}}
    try:
        with torch.no_grad(), warnings.catch_warnings(), _traceable_attention(encoder):
            # the TorchScript exporter (no onnxscript needed) warns about its deprecation and about python branches
            # in the traced code; the export is checked against the module right after, which is what matters
            warnings.simplefilter("ignore")
            torch.onnx.export(_OnnxGraph(encoder), args, str(tmp), dynamo=False, input_names=["input_ids",
                              "attention_mask"], output_names=["embeddings"], dynamic_axes=axes, opset_version=opset)
    finally:
        encoder.train(was_training)
    model = onnx.load(str(tmp), load_external_data=False)
    for key, value in pooling_settings(encoder).items():
        model.metadata_props.add(key=key, value=json.dumps(value))
    onnx.save(model, str(tmp))
