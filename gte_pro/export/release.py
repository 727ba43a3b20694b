"""After training (rank 0): every export written and verified against the module, metrics.md, the model card and
the deployment checks (the ``export/`` config group)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from gte_pro.errors import MissingDependencyError
from gte_pro.evaluation.report import metrics_table
from gte_pro.export.card import card_sections, write_model_card
from gte_pro.export.verify import (
    VERIFY_TEXTS,
    cpu_vs_device,
    hf_embedder,
    onnx_embedder,
    st_or_own_embedder,
    state_dict_round_trip,
    verify_export,
)
from gte_pro.export.writers import export_adapter, export_hf, export_onnx
from gte_pro.models.encoder import Encoder
from gte_pro.utils.files import write_text_atomic

log = logging.getLogger(__name__)


def check_export_requirements(options: Any) -> None:
    """Fail before training, not after it, when an export asks for packages that are not installed."""
    if options and options.get("onnx"):
        missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
        if missing:
            raise MissingDependencyError(f"export.onnx=true needs {', '.join(missing)}: pip install -e '.[export]' "
                              f"(or set export.onnx=false)")


def export_and_verify(encoder: Encoder, output_dir: Path, options: Any,
                      texts: Sequence[str] = VERIFY_TEXTS) -> dict[str, float]:
    """Verify ``<run>/model`` (already written) and write + verify the optional exports: worst cosine of each."""
    texts = list(texts)
    reference = encoder.encode(texts)
    min_cosine = float(options.min_cosine)
    model_dir = output_dir / "model"
    cosines = {"sentence_transformers": verify_export(
        "sentence-transformers", reference, st_or_own_embedder(model_dir, encoder.max_length), texts, min_cosine)}
    if options.hf:
        hf_dir = export_hf(encoder, output_dir / "hf")
        cosines["hf"] = verify_export("Hugging Face", reference, hf_embedder(hf_dir), texts, min_cosine)
    if options.onnx:
        onnx_path = export_onnx(encoder, output_dir / "model.onnx", opset=int(options.onnx_opset))
        cosines["onnx"] = verify_export("ONNX", reference, onnx_embedder(onnx_path, model_dir), texts, min_cosine)
    return cosines


def release(encoder: Encoder, output_dir: Path, cfg: DictConfig, summary: dict[str, Any],
            fresh: Callable[[], Encoder]) -> dict[str, Any]:
    """Everything after ``<run>/model`` is written: exports + verification, metrics.md, model card, checks.

    ``fresh`` builds a new encoder from the config (the state-dict round trip loads into it).
    """
    options = cfg.export  # every key filled by ExportSchema (gte_pro/config/schema/export.py)
    texts = list(VERIFY_TEXTS)
    report: dict[str, Any] = {"verify_texts": len(texts), "min_cosine": export_and_verify(encoder, output_dir,
                                                                                            options, texts)}
    report["state_dict_round_trip_max_abs_diff"] = state_dict_round_trip(
        encoder, fresh(), texts, float(options.round_trip_max_abs_diff))
    report["cpu_vs_gpu_max_abs_diff"] = cpu_vs_device(encoder, texts, float(options.gpu_max_abs_diff))
    if encoder.lora:  # the merged weights are model/ and hf/; the adapter alone for peft users
        report["adapter"] = str(export_adapter(encoder, output_dir / "adapter"))
    table = metrics_table(summary.get("val"), summary.get("val_before"))
    write_text_atomic(output_dir / "metrics.md", f"# Retrieval metrics after training\n\n{table}")
    if options.model_card:
        sections = card_sections(cfg, summary)
        write_model_card(output_dir / "model", encoder, base_model=sections["base_model"], data=sections["data"],
                         loss=sections["loss"], hyperparameters=sections["hyperparameters"], metrics_md=table)
    return report
