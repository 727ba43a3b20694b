"""``quantization.json`` beside an exported model trained with ``loss.quantization_aware``: what a user needs to
quantize embeddings the way the model was trained to be quantized.

    {"int8_ranges": [[min per dimension], [max per dimension]], "binary_threshold": 0.0,
     "trained_for": ["binary", "int8"], "source": "..."}

The int8 ranges are the training's moving average of the per-dimension min/max of each batch's documents (Jacob et
al. 2018, "Quantization and Training of Neural Networks for Efficient Integer-Arithmetic-Only Inference": the ranges
the fake quantization trained with). They are sentence-transformers' ``ranges`` argument::

    import numpy as np
    from sentence_transformers import SentenceTransformer
    # sentence-transformers 2.x-4.x: from sentence_transformers.quantization import quantize_embeddings
    from sentence_transformers.util.quantization import quantize_embeddings
    from gte_pro.export.quantization import load_quantization

    model = SentenceTransformer(folder)
    settings = load_quantization(folder)
    int8 = quantize_embeddings(model.encode(texts), precision="int8", ranges=settings["int8_ranges"])
    bits = quantize_embeddings(model.encode(texts), precision="ubinary")  # threshold 0: x > 0

``gte_pro.evaluation.quantize.quantize(x, "int8", ranges)`` gives the same values (tested).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gte_pro.utils.files import write_text_atomic

log = logging.getLogger(__name__)

QUANTIZATION_FILE = "quantization.json"
SOURCE = ("loss.quantization_aware: moving average (momentum 0.9) of the per-dimension min/max of the training "
          "batches' documents, as the int8 fake quantization trained with")


def write_quantization(folder: str | Path, ranges: torch.Tensor, trained_for: Sequence[str]) -> Path:
    """Write ``<folder>/quantization.json`` from the (2, dim) int8 ranges the training used."""
    path = Path(folder) / QUANTIZATION_FILE
    blob = {"int8_ranges": ranges.detach().float().cpu().tolist(), "binary_threshold": 0.0,
            "trained_for": list(trained_for), "source": SOURCE}
    write_text_atomic(path, json.dumps(blob) + "\n")
    log.info("wrote the int8 ranges and binary threshold the model was trained with to %s", path)
    return path


def load_quantization(folder: str | Path) -> dict[str, Any]:
    """``quantization.json`` of an exported model, ``int8_ranges`` as a (2, dim) float32 numpy array (the
    ``ranges`` of sentence-transformers' ``quantize_embeddings``)."""
    blob = json.loads((Path(folder) / QUANTIZATION_FILE).read_text())
    blob["int8_ranges"] = np.asarray(blob["int8_ranges"], dtype=np.float32)
    return blob
