"""The data checks of the memory plan (``make bench-memory ARGS=--data``, tests/test_memory.py): JSON-lines files
of short, mixed and long texts, the estimate a run prints for its data's largest batch, and the measured peak of
live tensors over the training loader's real batches on the CPU."""

from __future__ import annotations

import contextlib
from typing import Any

# texts of the data checks, in words: short (a search box), mixed (mined passages: median ~37 words, 90th percentile
# ~90, a few past max_length) and long (every document past max_length)
WORDS = ["alpha", "beta", "gamma", "delta", "river", "stone", "market", "policy", "engine", "signal", "protein",
         "orbit"]
DATA_KINDS = ("short", "mixed", "long")


def write_texts(path: Any, rows: int, kind: str, negatives: int = 3, seed: int = 0) -> Any:
    """A JSON-lines file of ``rows`` (query, positive, ``negatives`` negatives) with texts of ``kind`` lengths."""
    import json
    import random

    rng = random.Random(seed)

    def text(prefix: str, scale: float = 1.0) -> str:
        if kind == "short":
            n = rng.randint(3, 12)
        elif kind == "long":
            n = rng.randint(300, 400)
        else:
            n = min(400, int(rng.lognormvariate(3.6, 0.7)))
        return " ".join([prefix, *(rng.choice(WORDS) for _ in range(max(2, int(n * scale))))])

    with open(path, "w", encoding="utf-8") as out:
        for i in range(rows):
            row = {"query": text(f"q{i}", 0.25), "pos": [text(f"p{i}")],
                   "neg": [text(f"n{i}") for _ in range(negatives)]}
            out.write(json.dumps(row) + "\n")
    return path


def planned_peak(cfg: Any) -> tuple[float, float]:
    """(the plan's peak for the data's largest batch, its full-length worst case), as a run prints them (CPU)."""
    from gte_pro.modes.build import build_data_before_model
    from gte_pro.preflight.batch_lengths import batch_lengths
    from gte_pro.preflight.memory_budget import judged
    from gte_pro.preflight.memory_estimate import estimate, meta_backbone, shape_of
    from gte_pro.preflight.per_device import setup_of

    shape, setup = shape_of(meta_backbone(cfg.model)), setup_of(cfg, cuda=False)
    data = batch_lengths(cfg, build_data_before_model(cfg), cuda=False)
    return judged(shape, setup, data)[0].peak, estimate(shape, setup).peak


def measured_data_peak(cfg: Any, steps: set[int] | None = None) -> float:
    """The peak bytes of live tensors over epoch 0 of the config's training loader (or its ``steps``), each batch
    through the training module's own loss (length chunks, GradCache as configured) and AdamW, on the CPU."""
    import torch

    from gte_pro.modes.build import build_data_for, build_encoder, build_module
    from gte_pro.utils.live_bytes import LiveBytes

    torch.manual_seed(0)
    encoder = build_encoder(cfg).train()
    module = build_module(cfg, encoder)
    datamodule = build_data_for(cfg, module)
    datamodule.prepare_data()
    datamodule.setup("fit")
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-4)
    mixed = "mixed" in str(cfg.trainer.precision)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if mixed else contextlib.nullcontext
    counter = LiveBytes()
    counter.add([*encoder.parameters(), *encoder.buffers()])
    with counter:
        for step, batch in enumerate(datamodule.train_dataloader()):
            if steps is not None and step not in steps:
                continue
            with autocast():
                loss = module._contrastive_loss(batch).loss
            loss.backward()
            del loss
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return float(counter.peak)
