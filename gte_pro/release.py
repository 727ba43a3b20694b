"""After training (rank 0): every export verified against the module, the model card, and deployment checks.

The run fails (``ExportMismatchError``) when an export does not reproduce the module's embeddings, when a
state-dict round trip changes them, or when CPU and GPU disagree beyond ``export.gpu_max_abs_diff``.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from gte_pro.export import (
    VERIFY_TEXTS,
    Embedder,
    ExportMismatchError,
    export_hf,
    export_onnx,
    hf_embedder,
    onnx_embedder,
    st_embedder,
    verify_export,
    write_model_card,
)
from gte_pro.model import Encoder
from gte_pro.report import metrics_table

log = logging.getLogger(__name__)


def check_export_requirements(options: Any) -> None:
    """Fail before training, not after it, when an export asks for packages that are not installed."""
    if options and options.get("onnx"):
        missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
        if missing:
            raise ImportError(f"export.onnx=true needs {', '.join(missing)}: pip install -e '.[export]' "
                              f"(or set export.onnx=false)")


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


def cpu_vs_device(encoder: Encoder, texts: Sequence[str], tolerance: float, device: str = "cuda") -> float | None:
    """Max abs difference of fp32 embeddings on the CPU and on ``device`` (None when there is no such device).

    TF32 is switched off for the comparison: it is a documented precision trade, not a deployment bug.
    """
    if device.startswith("cuda") and not torch.cuda.is_available():
        return None
    cpu = encoder if next(encoder.parameters()).device.type == "cpu" else copy.deepcopy(encoder).cpu()
    other = copy.deepcopy(encoder).float().to(device)
    previous = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        diff = float((cpu.float().encode(texts) - other.encode(texts)).abs().max())
    finally:
        torch.set_float32_matmul_precision(previous)
    if diff > tolerance:
        raise ExportMismatchError(f"CPU and {device} embeddings differ: max abs diff {diff:.3e} > {tolerance:.1e}")
    log.info("CPU vs %s embeddings: max abs diff %.3e", device, diff)
    return diff


# --- exports -----------------------------------------------------------------------------------------------------
def _st_or_own_embedder(folder: Path, max_length: int) -> Embedder:
    """sentence-transformers when installed; otherwise our own loader reads the exported files (still a check of
    the weights, pooling and normalisation that were written)."""
    if importlib.util.find_spec("sentence_transformers") is not None:
        return st_embedder(folder)
    log.warning("sentence-transformers is not installed: verifying %s with gte_pro's own loader", folder)
    return Encoder(str(folder), max_length=max_length).encode


def export_and_verify(encoder: Encoder, output_dir: Path, options: Any,
                      texts: Sequence[str] = VERIFY_TEXTS) -> dict[str, float]:
    """Verify ``<run>/model`` (already written) and write + verify the optional exports: worst cosine of each."""
    texts = list(texts)
    reference = encoder.encode(texts)
    min_cosine = float(options.get("min_cosine", 0.9999))
    model_dir = output_dir / "model"
    cosines = {"sentence_transformers": verify_export(
        "sentence-transformers", reference, _st_or_own_embedder(model_dir, encoder.max_length), texts, min_cosine)}
    if options.get("hf"):
        hf_dir = export_hf(encoder, output_dir / "hf")
        cosines["hf"] = verify_export("Hugging Face", reference, hf_embedder(hf_dir), texts, min_cosine)
    if options.get("onnx"):
        onnx_path = export_onnx(encoder, output_dir / "model.onnx", opset=int(options.get("onnx_opset", 17)))
        cosines["onnx"] = verify_export("ONNX", reference, onnx_embedder(onnx_path, model_dir), texts, min_cosine)
    return cosines


# --- model card --------------------------------------------------------------------------------------------------
def _short(target: str | None) -> str:
    return str(target or "").rsplit(".", 1)[-1]


def card_sections(cfg: DictConfig, summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Base model, data, loss and hyper-parameter rows of the model card, from the run's config and summary."""
    model, data = cfg.model, cfg.data
    base = str(model.name_or_path)
    if model.get("random_init_config"):
        base = f"randomly initialised BERT {dict(model.random_init_config)} with the tokenizer of {base}"
    sources = {key: str(data[key]) for key in ("path", "train_file", "val_file", "name") if data.get(key)}
    kept = "; ".join(f"{r['source']}: {r['kept']} of {r['read']} rows kept" for r in summary.get("data") or [])
    scheduler = cfg.get("scheduler")
    hyper = {
        "learning rate": summary.get("lr"), "batch size per device": data.batch_size,
        "devices": summary.get("world_size"), "hard negatives per query": data.num_negatives,
        "max length": data.max_length, "epochs": cfg.trainer.max_epochs, "optimizer steps": summary.get("global_step"),
        "precision": cfg.trainer.precision, "optimizer": _short(cfg.optimizer.get("_target_")),
        "weight decay": cfg.optimizer.get("weight_decay"),
        "scheduler": _short(scheduler.fn.get("_target_")) if scheduler else "none",
        "warmup ratio": scheduler.get("warmup_ratio") if scheduler else 0, "seed": cfg.seed,
    }
    return {
        "base_model": base,
        "data": {"source": _short(data.get("_target_")), **sources, "cleaning": kept or "n/a"},
        "loss": {"loss": _short(cfg.loss.get("_target_")), "temperature": cfg.loss.get("temperature"),
                 "negatives gathered across devices": cfg.loss.get("gather_across_devices")},
        "hyperparameters": hyper,
    }


def release(encoder: Encoder, output_dir: Path, cfg: DictConfig, summary: dict[str, Any],
            fresh: Callable[[], Encoder]) -> dict[str, Any]:
    """Everything after ``<run>/model`` is written: exports + verification, metrics.md, model card, checks.

    ``fresh`` builds a new encoder from the config (the state-dict round trip loads into it).
    """
    options = cfg.get("export") or OmegaConf.create({})
    texts = list(VERIFY_TEXTS)
    report: dict[str, Any] = {"verify_texts": len(texts), "min_cosine": export_and_verify(encoder, output_dir,
                                                                                            options, texts)}
    report["state_dict_round_trip_max_abs_diff"] = state_dict_round_trip(
        encoder, fresh(), texts, float(options.get("round_trip_max_abs_diff", 1e-6)))
    report["cpu_vs_gpu_max_abs_diff"] = cpu_vs_device(encoder, texts, float(options.get("gpu_max_abs_diff", 1e-4)))
    table = metrics_table(summary.get("val"), summary.get("val_before"))
    (output_dir / "metrics.md").write_text(f"# Retrieval metrics after training\n\n{table}")
    if options.get("model_card", True):
        sections = card_sections(cfg, summary)
        write_model_card(output_dir / "model", encoder, base_model=sections["base_model"], data=sections["data"],
                         loss=sections["loss"], hyperparameters=sections["hyperparameters"], metrics_md=table)
    return report
