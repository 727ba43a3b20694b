"""Proving that an export reproduces the module: loaders for each layout (sentence-transformers, the HF README's own
code, onnxruntime), the embedding comparison, and the deployment checks (state-dict round trip, CPU vs GPU).

The run fails (``ExportMismatchError``) when an export does not reproduce the module's embeddings, when a
state-dict round trip changes them, or when CPU and GPU disagree beyond ``export.gpu_max_abs_diff``.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from gte_pro.export.writers import HF_POOLING_CODE, POOLING_FILE
from gte_pro.models.encoder import Encoder

log = logging.getLogger(__name__)

Embedder = Callable[[Sequence[str]], torch.Tensor]  # texts -> (N, dim) embeddings

# short and long (truncated), code, non-Latin: texts whose embeddings every export must reproduce
VERIFY_TEXTS = (
    "How do I sort a dictionary by value?",
    "Return a new list containing all items from the iterable in ascending order.",
    "tiny",
    "query: what is the capital of France?",
    "Paris is the capital and most populous city of France. " * 60,
    "Ünïcödé, emoji 🙂 and CJK 文本 survive tokenization.",
    "def f(x):\n    return x * 2  # code, with a newline",
)


class ExportMismatchError(RuntimeError):
    """An export does not reproduce the module's embeddings."""


def hf_embedder(folder: str | Path) -> Embedder:
    """Embeddings computed by the code the HF folder's README documents (plain transformers, no gte_pro code)."""
    namespace: dict[str, Any] = {}
    exec(HF_POOLING_CODE.format(folder=str(folder), pooling_file=POOLING_FILE), namespace)  # our own template
    return namespace["embed"]


def onnx_embedder(path: str | Path, tokenizer_folder: str | Path) -> Embedder:
    """Embeddings from onnxruntime (CPU) with the tokenizer of the exported folder."""
    import onnxruntime
    from transformers import AutoTokenizer

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    max_length = int(json.loads(session.get_modelmeta().custom_metadata_map["max_length"]))
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_folder))

    def embed(texts: Sequence[str]) -> torch.Tensor:
        batch = tokenizer(list(texts), padding=True, truncation=True, max_length=max_length, return_tensors="np")
        feeds = {"input_ids": batch["input_ids"].astype(np.int64),
                 "attention_mask": batch["attention_mask"].astype(np.int64)}
        return torch.from_numpy(session.run(["embeddings"], feeds)[0])

    return embed


def st_embedder(folder: str | Path) -> Embedder:
    """Embeddings from ``SentenceTransformer(folder)`` on the CPU."""
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), device="cpu")
    return lambda texts: model.encode(list(texts), convert_to_tensor=True).cpu()


def st_or_own_embedder(folder: Path, max_length: int) -> Embedder:
    """sentence-transformers when installed; otherwise our own loader reads the exported files (still a check of
    the weights, pooling and normalisation that were written)."""
    if importlib.util.find_spec("sentence_transformers") is not None:
        return st_embedder(folder)
    log.warning("sentence-transformers is not installed: verifying %s with gte_pro's own loader", folder)
    return Encoder.load(str(folder), max_length=max_length, length_chunks=1).encode  # one padded pass, like st


def verify_export(name: str, reference: torch.Tensor, embed: Embedder, texts: Sequence[str] = VERIFY_TEXTS,
                  min_cosine: float = 0.9999) -> float:
    """Worst cosine between ``reference`` (the module's embeddings of ``texts``) and the export's; raise below
    ``min_cosine``. The export sees a batch of one and a padded batch, so fixed shapes or a lost mask show up.
    Norms are compared too: cosine alone cannot see a missing normalisation.
    """
    theirs = torch.cat([embed(texts[:1]), embed(texts[1:])]).float().cpu()
    reference = reference.float().cpu()
    if theirs.shape != reference.shape:
        raise ExportMismatchError(f"{name} export: embeddings of shape {tuple(theirs.shape)}, the module's are "
                                  f"{tuple(reference.shape)}")
    cosine = F.cosine_similarity(theirs, reference, dim=-1)
    worst = int(cosine.argmin())
    norm_gap = float(((theirs.norm(dim=-1) - reference.norm(dim=-1)).abs() / reference.norm(dim=-1)).max())
    if float(cosine[worst]) < min_cosine or norm_gap > 1e-3:
        raise ExportMismatchError(f"{name} export does not reproduce the module: cosine {float(cosine[worst]):.6f} "
                                  f"(need >= {min_cosine}) on text {worst} {texts[worst][:50]!r}, largest relative "
                                  f"norm difference {norm_gap:.2e}")
    log.info("%s export verified: worst cosine %.7f over %d texts", name, float(cosine[worst]), len(texts))
    return float(cosine[worst])


# --- deployment checks -------------------------------------------------------------------------------------------
def state_dict_round_trip(encoder: Encoder, fresh: Encoder, texts: Sequence[str], tolerance: float) -> float:
    """Serialise the state dict, load it into a freshly built encoder: the embeddings must not change."""
    buffer = io.BytesIO()
    torch.save(encoder.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, map_location="cpu", weights_only=True))
    fresh.to(next(encoder.parameters()).device)
    diff = float((encoder.encode(texts) - fresh.encode(texts)).abs().max())
    if diff > tolerance:
        raise ExportMismatchError(f"state-dict round trip changed the embeddings: max abs diff {diff:.3e} "
                                  f"> {tolerance:.1e}")
    log.info("state-dict round trip: max abs diff %.3e", diff)
    return diff


def compare_devices(reference: Any, other: Any, texts: Sequence[str], tolerance: float,
                    name: str = "CPU and cuda", outputs: Callable[[Any], torch.Tensor] | None = None) -> float:
    """Max abs difference of the fp32 embeddings of ``texts`` by two encoders (e.g. the CPU model and its copy on a
    GPU); raise ``ExportMismatchError`` above ``tolerance``. ``outputs(model)``: what is compared (default: the
    embeddings of ``texts``; a reranker passes its scores of pairs).

    TF32 is switched off for the comparison: it is a documented precision trade, not a deployment bug.
    """
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        run = outputs or (lambda model: model.encode(texts))
        diff = float((run(reference) - run(other)).abs().max())
    finally:
        torch.set_float32_matmul_precision(previous)
    if diff > tolerance:
        raise ExportMismatchError(f"{name} embeddings differ: max abs diff {diff:.3e} > {tolerance:.1e}")
    log.info("%s embeddings: max abs diff %.3e", name, diff)
    return diff


def device_copy(encoder: Any, device: str) -> Any:
    """An fp32 copy of ``encoder`` on ``device`` (the encoder itself is left where and as it is)."""
    return copy.deepcopy(encoder).float().to(device)


def cpu_vs_device(encoder: Any, texts: Sequence[str], tolerance: float, device: str = "cuda",
                  outputs: Callable[[Any], torch.Tensor] | None = None) -> float | None:
    """Max abs difference of fp32 embeddings (or ``outputs``) on the CPU and on ``device`` (None when there is no
    such device)."""
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None
    parameter = next(encoder.parameters())
    on_cpu_fp32 = parameter.device.type == "cpu" and parameter.dtype == torch.float32
    cpu = encoder if on_cpu_fp32 else device_copy(encoder, "cpu")
    return compare_devices(cpu, device_copy(encoder, device), texts, tolerance, f"CPU and {device}", outputs)
