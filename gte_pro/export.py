"""Exporting a trained encoder so that other tools load it offline.

The sentence-transformers layout written here is the classic one (modules.json + 1_Pooling + 2_Normalize), which
every sentence-transformers release from 2.x to 6.x reads.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from gte_pro.model import Encoder

log = logging.getLogger(__name__)

_ST_POOLING_FLAGS = {
    "mean": "pooling_mode_mean_tokens",
    "cls": "pooling_mode_cls_token",
    "last": "pooling_mode_lasttoken",
}


def _write_json(path: Path, blob: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(blob, indent=2) + "\n")


def export_sentence_transformers(encoder: Encoder, folder: str | Path) -> Path:
    """Write ``encoder`` so that ``SentenceTransformer(folder)`` reproduces its embeddings.

    Written to a sibling temp folder first and renamed, so that a crash never leaves a half-written model where
    a previous export was.
    """
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    encoder.save(tmp)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]
    if encoder.normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"})
        (tmp / "2_Normalize").mkdir(parents=True, exist_ok=True)
    _write_json(tmp / "modules.json", modules)
    _write_json(tmp / "sentence_bert_config.json", {"max_seq_length": encoder.max_length, "do_lower_case": False})
    pooling = {flag: False for flag in ("pooling_mode_cls_token", "pooling_mode_mean_tokens",
                                        "pooling_mode_max_tokens", "pooling_mode_mean_sqrt_len_tokens",
                                        "pooling_mode_weightedmean_tokens", "pooling_mode_lasttoken")}
    pooling[_ST_POOLING_FLAGS[encoder.pooling]] = True
    _write_json(tmp / "1_Pooling" / "config.json",
                {"word_embedding_dimension": encoder.dim, **pooling, "include_prompt": True})
    prompts = {"query": encoder.query_prefix, "document": encoder.doc_prefix}
    _write_json(tmp / "config_sentence_transformers.json",
                {"prompts": prompts, "default_prompt_name": None, "similarity_fn_name": "cosine"})
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    log.info("exported sentence-transformers model to %s", folder)
    return folder
