"""The GradCache rows of ``make bench-memory ARGS=--gradcache``: the measured peak of steps through the project's own
loss and cached loss (gte_pro.training.gradcache), and what ``loss.mini_batch_size=auto`` picks."""

from __future__ import annotations

from typing import Any

from gte_pro.config.defaults import default_loss


def auto_choice(cfg: Any, budget: float) -> int | None:
    """What ``loss.mini_batch_size=auto`` in ``cfg`` resolves to under ``budget`` bytes, every text at full length
    (the plan of a run whose data's lengths are not known before training)."""
    from gte_pro.preflight.auto_mini_batch import choose
    from gte_pro.preflight.memory_budget import with_mini_batch
    from gte_pro.preflight.memory_estimate import estimate, meta_backbone, shape_of
    from gte_pro.preflight.per_device import setup_of

    shape, setup = shape_of(meta_backbone(cfg.model)), setup_of(cfg, cuda=False)
    return choose(lambda m: estimate(shape, with_mini_batch(setup, m)).peak, setup.batch_texts, budget, "budget",
                  fsdp=False).value


def measured_loss_peak(cfg: Any, steps: int = 2) -> float:
    """The peak bytes of live tensors over ``steps`` steps through the project's own loss (InfoNCE) and, under
    ``loss.mini_batch_size``, its cached loss (gte_pro.training.gradcache: the replay's gradient buffers included),
    the step's output held through backward as the training module holds it; every text at ``model.max_length``."""
    import torch

    from gte_pro.modes.build import build_encoder
    from gte_pro.training.gradcache import cached_loss
    from gte_pro.training.losses import split_documents
    from gte_pro.utils.live_bytes import LiveBytes

    torch.manual_seed(0)
    encoder = build_encoder(cfg).train()
    batch, negatives = int(cfg.data.batch_size), int(cfg.data.num_negatives)
    ids = torch.randint(5, min(len(encoder.tokenizer), 1000), (batch * (2 + negatives), int(cfg.model.max_length)))
    query = {"input_ids": ids[:batch], "attention_mask": torch.ones_like(ids[:batch])}
    docs = {"input_ids": ids[batch:], "attention_mask": torch.ones_like(ids[batch:])}
    optimizer = torch.optim.AdamW([p for p in encoder.parameters() if p.requires_grad], lr=1e-4)
    loss_fn, mini_batch = default_loss("infonce", temperature=0.05), cfg.loss.get("mini_batch_size")
    counter = LiveBytes()
    counter.add([*encoder.parameters(), *encoder.buffers()])
    with counter:
        for _ in range(steps):
            if mini_batch:
                out = cached_loss(encoder, loss_fn, query, docs, negatives, int(mini_batch))
            else:
                out = loss_fn(encoder(**query), *split_documents(encoder(**docs), batch, negatives))
            out.loss.backward()
            del out
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    return float(counter.peak)
