"""False-negative masking and hardness weighting (gte_pro.training.losses.partition): against loop references written
from the formulas, known answers worked by hand, off = plain InfoNCE bit for bit, exact under 2 gloo ranks and
under GradCache, composed with GTE, Matryoshka and the distillation losses, and refused when out of range."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.checks import config_problems
from gte_pro.config.defaults import default_loss
from gte_pro.training.losses import GTELoss, InfoNCELoss
from gte_pro.training.telemetry import step_telemetry
from tests.test_losses import _unit, reference_gte

TAU = 0.05


def reference_softmax_ce(terms: list[torch.Tensor], positive: int, tau: float, margin: float | None,
                         alpha: float) -> torch.Tensor:
    """One row's loss from its raw similarities, term by term, as the formulas in
    gte_pro/training/losses/partition.py."""
    s_pos = terms[positive]
    negatives = [s for j, s in enumerate(terms) if j != positive]
    if margin is not None:
        negatives = [s for s in negatives if not s.item() > s_pos.item() + margin]
    weights = [1.0] * len(negatives)
    if alpha and negatives:
        raw = [math.exp(alpha * s.item()) for s in negatives]
        weights = [w / (sum(raw) / len(raw)) for w in raw]
    denominator = torch.exp(s_pos / tau) + sum(w * torch.exp(s / tau) for w, s in zip(weights, negatives, strict=True))
    return -(s_pos / tau - torch.log(denominator))


def reference_infonce(q, pos, neg, tau, margin=None, alpha=0.0):
    docs = list(pos) + ([n for row in neg for n in row] if neg is not None else [])
    rows = [reference_softmax_ce([torch.dot(q[i], d) for d in docs], i, tau, margin, alpha) for i in range(len(q))]
    return sum(rows) / len(q)


def reference_gte_terms(q, pos, neg, tau, margin=None, alpha=0.0):
    """GTE's partition function (tests/test_losses.py's reference, eq. 3 of Li et al. 2023), each row's terms
    listed with the positive first."""
    n = len(q)
    docs = list(pos) + ([d for row in neg for d in row] if neg is not None else [])
    rows = []
    for i in range(n):
        terms = [torch.dot(q[i], d) for d in docs]
        terms += [torch.dot(q[i], q[j]) for j in range(n) if j != i]
        terms += [torch.dot(q[j], pos[i]) for j in range(n) if j != i]
        terms += [torch.dot(d, pos[i]) for j, d in enumerate(docs) if j != i]
        rows.append(reference_softmax_ce(terms, i, tau, margin, alpha))
    return sum(rows) / n


def _inputs(num_negatives: int, batch: int = 6, dim: int = 16):
    q, pos = _unit(batch, dim, seed=21) * 2, _unit(batch, dim, seed=22)
    neg = _unit(batch, num_negatives, dim, seed=23) * 3 if num_negatives else None
    # a duplicate pair and a near copy: real false negatives for masking to find
    with torch.no_grad():
        pos[1] = pos[0] * 1.5
        q[2] = pos[3] * 0.7 + q[2] * 0.05
    return q, pos, neg


@pytest.mark.parametrize("num_negatives", [0, 2])
@pytest.mark.parametrize(("margin", "alpha"), [(0.1, 0.0), (0.0, 0.0), (None, 5.0), (0.1, 5.0), (-0.0, 2.0)])
@pytest.mark.parametrize("loss_name", ["infonce", "gte"])
def test_values_and_gradients_match_the_formulas(loss_name, margin, alpha, num_negatives):
    q, pos, neg = _inputs(num_negatives)
    inputs = [t for t in (q, pos, neg) if t is not None]
    cls, reference = {"infonce": (InfoNCELoss, reference_infonce), "gte": (GTELoss, reference_gte_terms)}[loss_name]
    ours = default_loss(cls, temperature=TAU, false_negative_margin=margin, hardness_alpha=alpha)(q, pos, neg).loss
    unit = [None if t is None else F.normalize(t, dim=-1) for t in (q, pos, neg)]
    theirs = reference(*unit, TAU, margin, alpha)
    assert ours.item() == pytest.approx(theirs.item(), rel=1e-9)
    for mine, ref in zip(torch.autograd.grad(ours, inputs), torch.autograd.grad(theirs, inputs), strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-8, atol=1e-10)


def test_the_gte_reference_here_is_the_one_of_test_losses_when_both_are_off():
    q, pos, neg = _inputs(2)
    unit = [F.normalize(t, dim=-1) for t in (q, pos, neg)]
    assert reference_gte_terms(*unit, TAU).item() == pytest.approx(reference_gte(*unit, TAU).item(), rel=1e-12)


def test_a_worked_example_by_hand():
    """One query: positive 0.5; candidates 0.7 (a false negative at margin 0.1), 0.4 and 0.2."""
    tau, alpha = 0.1, 5.0
    vectors = torch.tensor([[0.5, math.sqrt(0.75)], [0.7, math.sqrt(0.51)], [0.4, math.sqrt(0.84)],
                            [0.2, math.sqrt(0.96)]], dtype=torch.float64)
    query = torch.tensor([[1.0, 0.0]], dtype=torch.float64)
    negatives = vectors[1:][None]
    masked = default_loss("infonce", temperature=tau, false_negative_margin=0.1)(query, vectors[:1], negatives)
    expected = -math.log(math.exp(5) / (math.exp(5) + math.exp(4) + math.exp(2)))
    assert masked.loss.item() == pytest.approx(expected, rel=1e-12)
    assert masked.masked_share.item() == pytest.approx(1 / 3)
    # at margin 0.25 the 0.7 candidate stays (0.7 > 0.5 + 0.25 is false)
    kept = default_loss("infonce", temperature=tau, false_negative_margin=0.25)(query, vectors[:1], negatives)
    assert kept.masked_share.item() == 0.0
    weighted = default_loss("infonce", temperature=tau, false_negative_margin=0.1, hardness_alpha=alpha)(
                            query, vectors[:1], negatives)
    w_04, w_02 = math.exp(2.0), math.exp(1.0)
    mean = (w_04 + w_02) / 2
    expected = -math.log(math.exp(5) / (math.exp(5) + w_04 / mean * math.exp(4) + w_02 / mean * math.exp(2)))
    assert weighted.loss.item() == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_off_is_the_plain_loss_bit_for_bit(loss_cls):
    q, pos, neg = _inputs(2)
    plain = default_loss(loss_cls, temperature=TAU)(q, pos, neg)
    off = default_loss(loss_cls, temperature=TAU, false_negative_margin=None, hardness_alpha=0.0)(q, pos, neg)
    assert torch.equal(plain.loss, off.loss) and off.masked_share is None
    # a margin no cosine can clear masks nothing and changes nothing
    wide = default_loss(loss_cls, temperature=TAU, false_negative_margin=2.5)(q, pos, neg)
    assert torch.equal(plain.loss, wide.loss) and wide.masked_share.item() == 0.0
    outputs = (default_loss(loss_cls, temperature=TAU)(q, pos, neg),
               default_loss(loss_cls, temperature=TAU, hardness_alpha=0.0)(q, pos, neg))
    grads = [torch.autograd.grad(out.loss, [q, pos, neg]) for out in outputs]
    for a, b in zip(*grads, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_each_option_changes_the_loss_the_way_it_should(loss_cls):
    q, pos, neg = _inputs(2)
    plain = default_loss(loss_cls, temperature=TAU)(q, pos, neg).loss.item()
    masked = default_loss(loss_cls, temperature=TAU, false_negative_margin=0.1)(q, pos, neg)
    # fewer terms in the denominator: smaller, and the duplicate positive of row 0 is among the masked
    assert masked.loss.item() < plain - 1e-6 and masked.masked_share.item() > 0
    # the weights put more mass on the larger terms of the denominator: larger
    assert default_loss(loss_cls, temperature=TAU, hardness_alpha=5.0)(q, pos, neg).loss.item() > plain + 1e-6


def test_a_row_whose_negatives_are_all_masked_gives_finite_gradients():
    """Every candidate above the positive: the softmax keeps the positive alone (loss 0) and nothing is NaN."""
    q = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64, requires_grad=True)
    pos = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    out = default_loss("infonce", temperature=TAU, false_negative_margin=0.0, hardness_alpha=5.0)(q, pos)
    assert out.loss.item() == 0.0 and out.masked_share.item() == 1.0
    for grad in torch.autograd.grad(out.loss, [q, pos]):
        assert torch.isfinite(grad).all()


def test_they_compose_with_matryoshka_and_with_the_distillation_losses_in_batch_term():

    q, pos, neg = _inputs(2)
    options = {"false_negative_margin": 0.1, "hardness_alpha": 5.0}
    wide = default_loss("infonce", temperature=TAU, matryoshka_dims=[16], **options)(q, pos, neg)
    assert torch.equal(wide.loss, default_loss("infonce", temperature=TAU, **options)(q, pos, neg).loss)
    both = default_loss("infonce", temperature=TAU, matryoshka_dims=[16, 8], **options)(q, pos, neg)
    narrow = default_loss("infonce", temperature=TAU, **options)(q[:, :8], pos[:, :8], neg[..., :8])
    assert both.loss.item() == pytest.approx(wide.loss.item() + narrow.loss.item(), rel=1e-12)
    assert both.masked_share is not None  # the widest width's, for the telemetry
    teacher = torch.rand(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plain_kl = default_loss("distill_kl", temperature=TAU, teacher_temperature=1.0)(q, pos, neg, teacher)
    masked_kl = default_loss("distill_kl", temperature=TAU, teacher_temperature=1.0, **options)(q, pos, neg, teacher)
    masked_infonce = default_loss("infonce", temperature=TAU, **options)(q, pos, neg).loss
    plain_infonce = default_loss("infonce", temperature=TAU)(q, pos, neg).loss
    assert (masked_kl.loss - plain_kl.loss).item() == pytest.approx((masked_infonce - plain_infonce).item(), rel=1e-9)


def test_the_masked_share_reaches_the_telemetry():
    q, pos, neg = _inputs(2)
    out = default_loss("infonce", temperature=TAU, false_negative_margin=0.1)(q, pos, neg)
    figures = step_telemetry(out.scores, out.labels, out.query, out.positive, 2, None, out.masked_share)
    assert figures["telemetry/masked_share"] == pytest.approx(out.masked_share.item())
    plain = default_loss("infonce", temperature=TAU)(q, pos, neg)
    assert "telemetry/masked_share" not in step_telemetry(plain.scores, plain.labels, None, None, 2)


# --- exact under DDP (2 gloo ranks = 1 process on the whole batch) and under GradCache ----------------------------
BATCH, NEGATIVES, DIM = 6, 2, 8
OPTIONS = {f"{name}-m{margin}-a{alpha}": (name, margin, alpha) for name in ("infonce", "gte")
           for margin, alpha in ((0.05, 0.0), (None, 5.0), (0.05, 5.0))}


def _loss_and_grads(rows: slice, name: str, margin: float | None, alpha: float):
    q, pos, neg = (t[rows].clone().requires_grad_(True) for t in _inputs(NEGATIVES, BATCH, DIM))
    cls = {"infonce": InfoNCELoss, "gte": GTELoss}[name]
    loss = default_loss(cls, temperature=TAU, false_negative_margin=margin, hardness_alpha=alpha)(q, pos, neg).loss
    return loss, list(torch.autograd.grad(loss, [q, pos, neg]))


def test_two_ranks_equal_one_process_on_the_whole_batch(tmp_path):
    from tests.ddp_harness import assert_ranks_equal_one_process

    assert_ranks_equal_one_process(tmp_path, BATCH, OPTIONS, _loss_and_grads)


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_gradcache_gives_the_full_batchs_loss_and_gradients(loss_cls):
    from gte_pro.training.gradcache import cached_loss
    from gte_pro.training.losses import split_documents
    from tests.test_losses import _BagOfTokens, _tokens

    torch.manual_seed(0)
    encoder = _BagOfTokens()
    queries, docs = _tokens(BATCH, seed=1), _tokens(BATCH * (1 + NEGATIVES), seed=2)
    loss_fn = default_loss(loss_cls, temperature=TAU, false_negative_margin=0.0, hardness_alpha=5.0)
    full = loss_fn(encoder(**queries), *split_documents(encoder(**docs), BATCH, NEGATIVES))
    full.loss.backward()
    full_grad = encoder.embed.weight.grad.clone()
    encoder.zero_grad()
    cached = cached_loss(encoder, loss_fn, queries, docs, NEGATIVES, mini_batch_size=4)
    cached.loss.backward()
    assert cached.loss.item() == pytest.approx(full.loss.item(), rel=1e-12)
    assert cached.masked_share.item() == full.masked_share.item() > 0
    torch.testing.assert_close(encoder.embed.weight.grad, full_grad, rtol=1e-10, atol=1e-12)


# --- bad values end in the config check, before any model loads ---------------------------------------------------
@pytest.mark.parametrize(("overrides", "problem"), [
    (["loss.false_negative_margin=-0.1"], "loss.false_negative_margin=-0.1: expected a number >= 0 or null"),
    (["loss.hardness_alpha=-1"], "loss.hardness_alpha=-1.0: expected a number >= 0"),
    (["loss=gte", "loss.hardness_alpha=inf"], "loss.hardness_alpha=inf: expected a number >= 0"),
])
def test_out_of_range_values_are_named_by_the_config_check(make_cfg, overrides, problem):
    problems = config_problems(make_cfg(overrides))
    assert any(p.startswith(problem) for p in problems), problems


# --- kill-resume: the options keep no state, so a stopped and resumed run ends as an uninterrupted one -----------
@pytest.mark.slow
def test_a_run_with_both_options_stopped_mid_epoch_resumes_bit_identical(make_cfg, tmp_path):
    from tests.test_resume import RUN, stop_at_step_7_and_resume

    stop_at_step_7_and_resume(make_cfg, tmp_path, [*RUN, "loss.false_negative_margin=0.0", "loss.hardness_alpha=5"])
