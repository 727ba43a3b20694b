"""The losses against hand-written, loop-based references: values and gradients."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gte_pro.losses import GTELoss, InfoNCELoss


def _unit(*shape: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return F.normalize(torch.randn(*shape, generator=g, dtype=torch.float64), dim=-1).requires_grad_(True)


def reference_infonce(q, pos, neg, tau):
    docs = [pos[j] for j in range(len(pos))] + ([n for row in neg for n in row] if neg is not None else [])
    total = 0.0
    for i in range(len(q)):
        logits = [torch.dot(q[i], d) / tau for d in docs]
        total = total - (logits[i] - torch.logsumexp(torch.stack(logits), 0))
    return total / len(q)


def reference_gte(q, pos, neg, tau):
    """Li et al. 2023, eq. 3, written term by term."""
    docs = [pos[j] for j in range(len(pos))] + ([n for row in neg for n in row] if neg is not None else [])
    n = len(q)
    total = 0.0
    for i in range(n):
        terms = [torch.dot(q[i], d) / tau for d in docs]  # q_i -> all documents
        terms += [torch.dot(q[i], q[j]) / tau for j in range(n) if j != i]  # q_i -> other queries
        terms += [torch.dot(q[j], pos[i]) / tau for j in range(n)]  # all queries -> d_i
        terms += [torch.dot(d, pos[i]) / tau for j, d in enumerate(docs) if j != i]  # other documents -> d_i
        total = total - (torch.dot(q[i], pos[i]) / tau - torch.logsumexp(torch.stack(terms), 0))
    return total / n


@pytest.mark.parametrize("num_negatives", [0, 2])
@pytest.mark.parametrize(
    "loss_cls,reference,tau", [(InfoNCELoss, reference_infonce, 0.05), (GTELoss, reference_gte, 0.02)]
)
def test_loss_matches_reference_values_and_gradients(loss_cls, reference, tau, num_negatives):
    batch, dim = 6, 16
    q, pos = _unit(batch, dim, seed=1), _unit(batch, dim, seed=2)
    neg = _unit(batch, num_negatives, dim, seed=3) if num_negatives else None
    ours = loss_cls(temperature=tau)(q, pos, neg).loss
    grads = torch.autograd.grad(ours, [t for t in (q, pos, neg) if t is not None])
    ref = reference(q, pos, neg, tau)
    ref_grads = torch.autograd.grad(ref, [t for t in (q, pos, neg) if t is not None])
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-8)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-9)


def test_infonce_perfect_separation_is_near_zero_and_uniform_is_log_n():
    eye = torch.eye(4, dtype=torch.float64)
    assert InfoNCELoss(temperature=0.01)(eye, eye).loss.item() < 1e-6
    same = torch.ones(4, 3, dtype=torch.float64) / math.sqrt(3)
    assert InfoNCELoss(temperature=0.05)(same, same).loss.item() == pytest.approx(math.log(4))


def test_gte_loss_is_not_infonce():
    """The extra q->q, d->q and d->d terms must change the value (guards against a silent fallback)."""
    q, pos = _unit(5, 8, seed=4), _unit(5, 8, seed=5)
    assert GTELoss(0.05)(q, pos).loss.item() > InfoNCELoss(0.05)(q, pos).loss.item()


def test_temperature_must_be_positive():
    with pytest.raises(ValueError, match="temperature"):
        InfoNCELoss(temperature=0)
