"""Exports of a trained reranker (``task=rerank``), each loaded back and checked to reproduce the module's scores:

- ``<run>/model``: sentence-transformers' ``CrossEncoder`` layout, written by sentence-transformers itself
  (``CrossEncoder(folder).predict(pairs)`` returns the logits: the activation saved with it is the identity);
- ``<run>/hf`` (``export.hf``): the plain Hugging Face layout, ``AutoModelForSequenceClassification`` with one label.

Both are written to a temporary sibling and renamed into place. Without sentence-transformers installed,
``<run>/model`` is the Hugging Face layout, which ``CrossEncoder`` also reads (with its default sigmoid on top).
"""

from __future__ import annotations

import importlib.util
import io
import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from gte_pro.evaluation.report import metrics_table
from gte_pro.export.verify import VERIFY_TEXTS, ExportMismatchError, cpu_vs_device
from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.utils.files import write_atomic, write_text_atomic

log = logging.getLogger(__name__)

PairScorer = Callable[[Sequence[str], Sequence[str]], torch.Tensor]


def verify_pairs(texts: Sequence[str] = VERIFY_TEXTS) -> tuple[list[str], list[str]]:
    """(queries, documents): every verification text against its neighbour, short and long, code and prose."""
    texts = list(texts)
    return texts, texts[1:] + texts[:1]


def _has_sentence_transformers() -> bool:
    return importlib.util.find_spec("sentence_transformers") is not None


def export_cross_encoder(model: CrossEncoder, folder: str | Path) -> Path:
    """``<run>/model``: the CrossEncoder layout (the Hugging Face one without sentence-transformers)."""
    def fill(tmp: Path) -> None:
        if not _has_sentence_transformers():
            log.warning("sentence-transformers is not installed: %s is the Hugging Face layout (pip install -e "
                        "'.[export]' for the CrossEncoder layout)", folder)
            model.save(tmp)
            return
        from sentence_transformers import CrossEncoder as STCrossEncoder

        with tempfile.TemporaryDirectory() as plain:
            model.save(plain)
            st_model = STCrossEncoder(plain, activation_fn=torch.nn.Identity(), max_length=model.max_length,
                                      device="cpu")
            st_model.save_pretrained(str(tmp))

    write_atomic(folder, fill)
    log.info("exported the reranker (sentence-transformers CrossEncoder layout) to %s", folder)
    return Path(folder)


def export_cross_encoder_hf(model: CrossEncoder, folder: str | Path) -> Path:
    write_atomic(folder, model.save)
    return Path(folder)


def st_scorer(folder: str | Path) -> PairScorer:
    from sentence_transformers import CrossEncoder as STCrossEncoder

    st_model = STCrossEncoder(str(folder), device="cpu")

    def score(queries: Sequence[str], docs: Sequence[str]) -> torch.Tensor:
        return torch.as_tensor(st_model.predict(list(zip(queries, docs, strict=True)), convert_to_numpy=True))

    return score


def hf_scorer(folder: str | Path, max_length: int) -> PairScorer:
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    hf_model = AutoModelForSequenceClassification.from_pretrained(str(folder)).eval()

    @torch.inference_mode()
    def score(queries: Sequence[str], docs: Sequence[str]) -> torch.Tensor:
        features = tokenizer(list(queries), list(docs), padding=True, truncation=True, max_length=max_length,
                             return_tensors="pt")
        return hf_model(**features).logits[:, 0]

    return score


def verify_scores(name: str, reference: torch.Tensor, score: PairScorer, queries: Sequence[str],
                  docs: Sequence[str], tolerance: float) -> float:
    """Largest |export score - module score|, from a batch of one pair and a padded batch; raise above
    ``tolerance``."""
    theirs = torch.cat([score(queries[:1], docs[:1]), score(queries[1:], docs[1:])]).float().cpu()
    diff = float((theirs - reference.float().cpu()).abs().max())
    if diff > tolerance:
        raise ExportMismatchError(f"{name} export does not reproduce the reranker's scores: max abs diff "
                                  f"{diff:.3e} > {tolerance:.1e}")
    log.info("%s export verified: max abs score diff %.2e over %d pairs", name, diff, len(queries))
    return diff


def state_dict_round_trip(model: CrossEncoder, fresh: CrossEncoder, queries: Sequence[str], docs: Sequence[str],
                          tolerance: float) -> float:
    """The state dict saved and loaded into a freshly built reranker: the scores must not change."""
    buffer = io.BytesIO()
    torch.save(model.state_dict(), buffer)
    buffer.seek(0)
    fresh.load_state_dict(torch.load(buffer, map_location="cpu", weights_only=True))
    fresh.to(next(model.parameters()).device)
    diff = float((model.score(queries, docs) - fresh.score(queries, docs)).abs().max())
    if diff > tolerance:
        raise ExportMismatchError(f"state-dict round trip changed the reranker's scores: max abs diff {diff:.3e} "
                                  f"> {tolerance:.1e}")
    return diff


def release_reranker(model: CrossEncoder, output_dir: Path, cfg: DictConfig, summary: dict[str, Any],
                     fresh: Callable[[], CrossEncoder]) -> dict[str, Any]:
    """Rank 0, after ``<run>/model`` is written: verify it, write and verify ``<run>/hf``, the round trip, the
    CPU-vs-GPU check where there is a GPU, and metrics.md."""
    options = cfg.export  # every key filled by ExportSchema (gte_pro/config/schema/export.py)
    tolerance = float(options.score_max_abs_diff)
    queries, docs = verify_pairs()
    reference = model.score(queries, docs)
    scorer = st_scorer if _has_sentence_transformers() else (lambda f: hf_scorer(f, model.max_length))
    diffs = {"cross_encoder": verify_scores("CrossEncoder", reference, scorer(output_dir / "model"), queries, docs,
                                            tolerance)}
    if options.hf:
        hf_dir = export_cross_encoder_hf(model, output_dir / "hf")
        diffs["hf"] = verify_scores("Hugging Face", reference, hf_scorer(hf_dir, model.max_length), queries, docs,
                                    tolerance)
    report: dict[str, Any] = {"verify_pairs": len(queries), "max_abs_score_diff": diffs}
    report["state_dict_round_trip_max_abs_diff"] = state_dict_round_trip(
        model, fresh(), queries, docs, float(options.round_trip_max_abs_diff))
    report["cpu_vs_gpu_max_abs_diff"] = cpu_vs_device(model, list(VERIFY_TEXTS),
                                                      float(options.gpu_max_abs_diff),
                                                      outputs=lambda copy: copy.score(queries, docs))
    table = metrics_table(summary.get("val"), summary.get("val_before"))
    write_text_atomic(output_dir / "metrics.md", f"# Reranking metrics after training\n\n{table}")
    return report
