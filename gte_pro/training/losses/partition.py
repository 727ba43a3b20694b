"""What the partition function of a contrastive loss keeps, and how it weighs it.

Every contrastive loss here ends in a softmax cross-entropy of each query's positive over a row of candidate
similarities ``s_ij`` (InfoNCE: the batch's documents; GTE: also the query->query, doc->query and doc->doc terms;
the distillation losses' in-batch term: InfoNCE's). :func:`contrastive_cross_entropy` is that last step, shared, so
that the two options below compose with each of them the same way:

**False-negative masking** (``false_negative_margin`` m; Qwen3-Embedding, Zhang et al. 2025, sec. 3.1, uses m = 0.1):
a candidate j of row i whose similarity exceeds the positive's by more than m, ``s_ij > s_i+ + m``, is most likely
another relevant text (a duplicate positive in the batch, an unlabelled answer mined as a negative) and leaves the
denominator. The positive itself is never masked.

**Guided masking** (``guide``: GISTEmbed, Solatorio 2024, "GISTEmbed: Guided In-sample Selection of Training
Negatives for Text Embedding Fine-tuning"; sentence-transformers' ``GISTEmbedLoss``): a frozen guide model scores the
same terms, ``g_ij`` (cosine of the guide's embeddings, in the layout of ``s_ij``); a candidate with
``g_ij > g_i+ - guide_margin`` (sentence-transformers' ``margin_strategy="absolute"``, margin 0 by default) leaves the
denominator. The positive itself is never masked. The guide's scores come in computed (``gte_pro.training.guide``).

**Hardness weighting** (``hardness_alpha`` a; Lan et al. 2025, "LLaVE: Large Language and Vision Embedding Models
with Hardness-Weighted Contrastive Learning"; EmbeddingGemma uses a = 5): each remaining negative's term is weighted
by ``w_ij = exp(a * sg(s_ij)) / mean_k exp(a * sg(s_ik))`` (``sg``: no gradient; the mean over row i's remaining
negatives, so the weights average 1 and a = 0 is plain InfoNCE):

    L_i = -log( exp(s_i+ / t) / (exp(s_i+ / t) + sum_j w_ij exp(s_ij / t)) )

All three act per row on scores every rank already holds for its own queries (the guide's embeddings are gathered
as the student's), so they are exact under ``gather_across_devices`` (2 ranks = 1 process on the whole batch) and
under GradCache (the loss sees the whole batch's embeddings either way); they keep no state, so a resumed run
computes them as an uninterrupted one. Both masks are decided on the unmasked scores and applied together, each
reporting its own share. Off (margin null, no guide scores, alpha 0), the cross-entropy is computed exactly as
before, bit for bit.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """Softmax over 1/temperature-scaled scores in bf16/fp16 loses the ranking signal: compute it in fp32+."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def false_negatives(scores: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """(rows, candidates) bool: the candidates scored above their row's positive by more than ``margin``."""
    positive = scores.gather(1, labels[:, None])
    above = scores > positive + margin
    return above.scatter(1, labels[:, None], False)


def guided_false_negatives(guide_scores: torch.Tensor, labels: torch.Tensor, margin: float) -> torch.Tensor:
    """(rows, candidates) bool: the candidates the guide scores above its score of their row's positive minus
    ``margin`` (-inf terms, left out already, never are)."""
    positive = guide_scores.gather(1, labels[:, None])
    above = guide_scores > positive - margin
    return above.scatter(1, labels[:, None], False)


def hardness_log_weights(scores: torch.Tensor, labels: torch.Tensor, alpha: float) -> torch.Tensor:
    """(rows, candidates) ``log w_ij``, detached: 0 for the positive and for candidates already out (-inf)."""
    scores = scores.detach()
    negative = torch.isfinite(scores).scatter(1, labels[:, None], False)
    exponent = (alpha * scores).masked_fill(~negative, float("-inf"))
    count = negative.sum(dim=1, keepdim=True).clamp(min=1).to(scores.dtype)
    # a row with no negative left has nothing to weigh: a finite stand-in keeps its logsumexp finite (and unused)
    exponent_or_zero = exponent.masked_fill(~negative.any(dim=1, keepdim=True), 0.0)
    # log of exp(a s_ij) / mean_k exp(a s_ik)
    log_mean = torch.logsumexp(exponent_or_zero, dim=1, keepdim=True) - count.log()
    return torch.where(negative, exponent - log_mean, 0.0)


class Partition(NamedTuple):
    """The cross-entropy of a loss's partition function, and the shares of negative candidates each mask left out
    (detached; None where that mask is off)."""

    loss: torch.Tensor
    masked_share: torch.Tensor | None = None  # false_negative_margin's
    guide_masked_share: torch.Tensor | None = None  # the guide's


def contrastive_cross_entropy(scores: torch.Tensor, labels: torch.Tensor, temperature: float,
                              false_negative_margin: float | None = None, hardness_alpha: float = 0.0,
                              guide_scores: torch.Tensor | None = None, guide_margin: float = 0.0) -> Partition:
    """The mean cross-entropy of each row's ``labels`` column over ``scores / temperature``, with the shares masked.

    ``scores``: (rows, candidates) similarities, -inf where a loss left a term out already (GTE's self-terms);
    ``guide_scores``: the guide's scores of the same terms (same shape and -inf), or None."""
    logits = at_least_fp32(scores)
    out = Partition(logits)
    if false_negative_margin is not None or guide_scores is not None:
        negatives = (torch.isfinite(scores.detach()).sum() - labels.numel()).clamp(min=1)
        masks = []
        if false_negative_margin is not None:
            masks.append(false_negatives(logits.detach(), labels, false_negative_margin))
            out = out._replace(masked_share=masks[-1].sum() / negatives)
        if guide_scores is not None:
            masks.append(guided_false_negatives(at_least_fp32(guide_scores.detach()), labels, guide_margin))
            out = out._replace(guide_masked_share=masks[-1].sum() / negatives)
        logits = logits.masked_fill(masks[0] if len(masks) == 1 else masks[0] | masks[1], float("-inf"))
    if hardness_alpha:
        logits = logits / temperature + hardness_log_weights(logits, labels, hardness_alpha)
    else:
        logits = logits / temperature
    return out._replace(loss=F.cross_entropy(logits, labels))
