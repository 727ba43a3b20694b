"""Distillation losses (``loss=distill_kl``, ``loss=margin_mse``) against their reference implementations, with
gradients, masking of slots without a teacher score, GradCache, and short training runs.

References:
- ``margin_mse``: sentence-transformers' own ``MarginMSELoss.compute_loss_from_embeddings`` (installed), with its
  ``pairwise_dot_score`` / ``pairwise_cos_sim``;
- ``distill_kl``: FlagEmbedding's ``AbsEmbedderModel.distill_loss("kl_div", ...)`` and, for the loss with its in-batch
  term, ``AbsEmbedderModel._compute_in_batch_neg_loss``, when FlagEmbedding is importable (it is not a dependency:
  ``PYTHONPATH=<unpacked FlagEmbedding wheel>`` runs those tests); always against ``_flag_kl_div`` below, a verbatim
  copy of FlagEmbedding 1.4.2's formula (``FlagEmbedding/abc/finetune/embedder/AbsModeling.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.defaults import default_loss
from gte_pro.errors import ConfigError
from gte_pro.train import train
from gte_pro.training.losses import DistillKLLoss, InfoNCELoss, MarginMSELoss
from gte_pro.training.module import ContrastiveModule
from tests.conftest import write_jsonl
from tests.test_gradcache import _batch, _encoder, _take_grads

B, K, DIM = 5, 3, 16


def _inputs(seed: int = 0) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(seed)
    q, p, n = (torch.randn(*shape, generator=generator, dtype=torch.float64, requires_grad=True)
               for shape in ((B, DIM), (B, DIM), (B, K, DIM)))
    teacher = torch.randn(B, 1 + K, generator=generator, dtype=torch.float64) * 3
    return q, p, n, teacher


def _grads(loss: torch.Tensor, *leaves: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, leaves, retain_graph=True))


def _assert_close(ours: torch.Tensor, reference: torch.Tensor, leaves: tuple[torch.Tensor, ...]) -> None:
    """The loss and its gradient with respect to every embedding, to 1e-6 (float64: in practice ~1e-15)."""
    assert ours.item() == pytest.approx(reference.item(), abs=1e-6, rel=1e-6)
    for mine, theirs in zip(_grads(ours, *leaves), _grads(reference, *leaves), strict=True):
        assert theirs.abs().max() > 0
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=1e-6)


def _own_scores(q: torch.Tensor, p: torch.Tensor, n: torch.Tensor, cosine: bool) -> torch.Tensor:
    if cosine:
        q, p, n = F.normalize(q, dim=-1), F.normalize(p, dim=-1), F.normalize(n, dim=-1)
    return torch.cat([(q * p).sum(-1, keepdim=True), (q[:, None] * n).sum(-1)], dim=1)


# --- margin_mse vs sentence-transformers ------------------------------------------------------------------------------
@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("k", [1, K])
def test_margin_mse_equals_sentence_transformers(similarity, k):
    from sentence_transformers.sentence_transformer.losses import MarginMSELoss as STMarginMSE
    from sentence_transformers.util import pairwise_cos_sim, pairwise_dot_score

    q, p, n, teacher = _inputs()
    n, teacher = n[:, :k], teacher[:, : 1 + k]
    ours = default_loss("margin_mse", similarity=similarity)(q, p, n, teacher_scores=teacher).loss
    reference_loss = STMarginMSE(None, pairwise_dot_score if similarity == "dot" else pairwise_cos_sim)
    # sentence-transformers takes [query, positive, negative_1, ...] and labels [t_pos, t_neg_1, ...] (it forms
    # the teacher margins itself)
    reference = reference_loss.compute_loss_from_embeddings([q, p, *n.unbind(1)], teacher)
    _assert_close(ours, reference, (q, p, n))


def test_margin_mse_with_infonce_weight_adds_the_in_batch_term():
    q, p, n, teacher = _inputs(1)
    alone = default_loss("margin_mse", weight_infonce=0.0)(q, p, n, teacher_scores=teacher).loss
    infonce = default_loss("infonce", temperature=0.05, similarity="dot")(q, p, n).loss  # the loss's similarity: dot
    combined = default_loss("margin_mse", temperature=0.05, weight_infonce=0.3)(q, p, n, teacher_scores=teacher).loss
    _assert_close(combined, alone + 0.3 * infonce, (q, p, n))


# --- distill_kl vs FlagEmbedding --------------------------------------------------------------------------------------
def _flag_kl_div(teacher_targets: torch.Tensor, student_scores: torch.Tensor) -> torch.Tensor:
    """FlagEmbedding 1.4.2, AbsEmbedderModel.distill_loss, kd_loss_type == 'kl_div' (verbatim)."""
    return - torch.mean(
        torch.sum(torch.log_softmax(student_scores, dim=-1) * teacher_targets, dim=-1)
    )


def _flag_embedder_model():
    try:
        from FlagEmbedding.abc.finetune.embedder.AbsModeling import AbsEmbedderModel
    except ImportError:
        pytest.skip("FlagEmbedding is not importable (not a dependency); _flag_kl_div covers its formula")
    return AbsEmbedderModel


@pytest.mark.parametrize("similarity", ["dot", "cosine"])
@pytest.mark.parametrize("teacher_temperature", [1.0, 0.5])
def test_distill_kl_equals_flagembeddings_formula(similarity, teacher_temperature):
    q, p, n, teacher = _inputs(2)
    tau = 0.05
    ours = default_loss("distill_kl", temperature=tau, teacher_temperature=teacher_temperature, weight_infonce=0.0,
                        similarity=similarity)(q, p, n, teacher_scores=teacher).loss
    # FlagEmbedding: teacher_targets = softmax(teacher_scores), student scores = similarity / temperature
    student = _own_scores(q, p, n, similarity == "cosine") / tau
    reference = _flag_kl_div(F.softmax(teacher / teacher_temperature, dim=-1), student)
    _assert_close(ours, reference, (q, p, n))
    # the soft cross-entropy is KL(p_t || p_s) plus the teacher's entropy (a constant): same gradients
    targets = F.softmax(teacher / teacher_temperature, dim=-1)
    kl = F.kl_div(F.log_softmax(student, dim=-1), targets, reduction="batchmean")
    entropy = -(targets * targets.log()).sum(-1).mean()
    _assert_close(ours, kl + entropy, (q, p, n))


def test_distill_kl_equals_flagembeddings_own_function():
    model = _flag_embedder_model()
    q, p, n, teacher = _inputs(3)
    loss = default_loss("distill_kl", temperature=0.05, weight_infonce=0.0, similarity="dot")
    ours = loss(q, p, n, teacher_scores=teacher)
    reference = model.distill_loss("kl_div", F.softmax(teacher, dim=-1), _own_scores(q, p, n, False) / 0.05)
    _assert_close(ours.loss, reference, (q, p, n))


def test_distill_kl_with_weight_1_equals_flagembeddings_in_batch_loss():
    """FlagEmbedding's kl_div training loss with in-batch negatives: its distillation term plus its cross-entropy
    over every passage of the batch, which is our InfoNCE term (with weight_infonce=1, its default)."""
    model = _flag_embedder_model()
    q, p, n, teacher = _inputs(4)
    tau = 0.05
    ours = default_loss("distill_kl", temperature=tau, similarity="dot")(q, p, n, teacher_scores=teacher).loss
    # FlagEmbedding's layout: each query's group [positive, its negatives], groups in query order
    p_reps = torch.cat([p[:, None], n], dim=1).reshape(-1, DIM)
    fake = SimpleNamespace(kd_loss_type="kl_div", distill_loss=model.distill_loss,
                           compute_score=lambda a, b: a @ b.T / tau,
                           compute_loss=lambda scores, target: F.cross_entropy(scores, target))
    fake.get_local_score = lambda *args: model.get_local_score(fake, *args)
    _, reference = model._compute_in_batch_neg_loss(fake, q, p_reps, teacher_targets=F.softmax(teacher, dim=-1))
    _assert_close(ours, reference, (q, p, n))


# --- slots without a teacher score ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["distill_kl", "margin_mse"])
def test_a_slot_without_teacher_score_is_left_out(name):
    """A NaN slot counts as if that negative were not there; a row with no scored negative adds nothing."""
    q, p, n, teacher = _inputs(5)
    make = {"distill_kl": lambda: default_loss("distill_kl", weight_infonce=0.0),
            "margin_mse": lambda: default_loss("margin_mse", weight_infonce=0.0)}[name]
    holes = teacher.clone()
    holes[1, 2] = math.nan
    holes[3, 1:] = math.nan  # no negative of query 3 is scored
    ours = make()(q, p, n, teacher_scores=holes).loss
    # the reference: each query on its own with only its scored negatives, averaged as the loss averages
    if name == "distill_kl":
        per_query = [make()(q[i:i + 1], p[i:i + 1], n[i:i + 1, keep], teacher_scores=teacher[i:i + 1, [0, *(
            1 + j for j in keep)]]).loss for i, keep in ((0, [0, 1, 2]), (1, [0, 2]), (2, [0, 1, 2]), (4, [0, 1, 2]))]
        # query 3: only its positive is scored, a softmax over one candidate: loss 0, yet it counts in the mean
        reference = sum(per_query) / 5
    else:
        errors = ((_own_scores(q, p, n, False)[:, :1] - _own_scores(q, p, n, False)[:, 1:])
                  - (teacher[:, :1] - teacher[:, 1:])).pow(2)
        keep = torch.isfinite(holes[:, :1] - holes[:, 1:])
        reference = errors[keep].mean()
    _assert_close(ours, reference, (q, p, n))


def test_a_query_without_any_teacher_score_adds_nothing_and_no_nan():
    q, p, n, teacher = _inputs(6)
    holes = teacher.clone()
    holes[2] = math.nan  # e.g. a row of an unscored source in data=mix
    keep = [0, 1, 3, 4]
    for make in (lambda: default_loss("distill_kl", weight_infonce=0.0), lambda: default_loss("margin_mse")):
        ours = make()(q, p, n, teacher_scores=holes).loss
        reference = make()(q[keep], p[keep], n[keep], teacher_scores=teacher[keep]).loss
        assert ours.item() == pytest.approx(reference.item(), rel=1e-9)
        grads = _grads(ours, q, p, n)
        assert all(torch.isfinite(g).all() for g in grads) and grads[0][2].abs().max() == 0
    # a batch with no teacher score at all (data=mix: a batch of an unscored source): the InfoNCE term alone
    unscored = torch.full_like(teacher, math.nan)
    for make in (DistillKLLoss, MarginMSELoss):
        out = default_loss(make, weight_infonce=0.5, temperature=0.05)(q, p, n, teacher_scores=unscored).loss
        infonce = default_loss("infonce", temperature=0.05, similarity=default_loss(make).similarity)(q, p, n).loss
        _assert_close(out, 0.5 * infonce, (q, p, n))


def test_distillation_needs_teacher_scores_and_negatives():
    q, p, n, teacher = _inputs()
    for loss in (default_loss("distill_kl"), default_loss("margin_mse")):
        with pytest.raises(ConfigError, match="needs teacher scores: give the training rows pos_scores"):
            loss(q, p, n)
        with pytest.raises(ConfigError, match="data.num_negatives >= 1"):
            loss(q, p, None, teacher_scores=teacher[:, :1])


def test_matryoshka_sums_the_distillation_loss_at_each_width():
    q, p, n, teacher = _inputs(7)
    loss = default_loss("distill_kl", matryoshka_dims=[16, 8], matryoshka_weights=[1.0, 0.5])
    ours = loss(q, p, n, teacher_scores=teacher)
    widths = [default_loss("distill_kl")(q[:, :d], p[:, :d], n[..., :d], teacher_scores=teacher).loss for d in (16, 8)]
    _assert_close(ours.loss, widths[0] + 0.5 * widths[1], (q, p, n))


# --- through the training step, with and without GradCache ------------------------------------------------------------
@pytest.mark.parametrize("loss_class", [DistillKLLoss, MarginMSELoss])
@pytest.mark.parametrize("mini_batch_size", [1, 4])
def test_gradcache_gives_the_same_loss_and_gradients(loss_class, mini_batch_size):
    """The module's training step with loss.mini_batch_size (GradCache) equals the uncached one: the loss and
    every parameter gradient, the teacher scores reaching the loss from the batch either way."""
    encoder = _encoder()
    batch = _batch(encoder)
    rows, k = batch["query"]["input_ids"].shape[0], batch["num_negatives"]
    batch["teacher_scores"] = torch.randn(rows, 1 + k, generator=torch.Generator().manual_seed(0)) * 2
    batch["teacher_scores"][0, 1] = math.nan  # a filled slot without a teacher score

    def step(mini: int | None) -> tuple[float, dict]:
        module = ContrastiveModule(encoder, default_loss(loss_class, weight_infonce=0.5, mini_batch_size=mini),
                                   optimizer=torch.optim.SGD, lr=0.1)
        out = module._contrastive_loss(batch)
        out.loss.backward()
        return out.loss.item(), _take_grads(encoder)

    reference, reference_grads = step(None)
    cached, grads = step(mini_batch_size)
    assert cached == pytest.approx(reference, abs=1e-6, rel=1e-6)
    assert grads.keys() == reference_grads.keys() and len(grads) > 10
    for name, grad in reference_grads.items():
        assert grad.abs().max() > 0, name
        torch.testing.assert_close(grads[name], grad, atol=1e-6, rtol=1e-6, msg=name)


# --- short training runs ----------------------------------------------------------------------------------------------
def _scored_file(path: Path) -> Path:
    return write_jsonl(path, [{
        "query": f"what is topic number {i}?",
        "pos": [f"Topic {i} is a subject that covers item {i} in depth, with examples."],
        "neg": [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(3)],
        "pos_scores": [0.9], "neg_scores": [0.5 - 0.2 * j for j in range(3)]} for i in range(80)])


@pytest.mark.parametrize("loss,extra", [("distill_kl", []), ("margin_mse", ["loss.mini_batch_size=4",
                                                                            "loss.weight_infonce=0.1"])])
def test_a_tiny_run_trains_with_the_distillation_loss(make_cfg, tmp_path, monkeypatch, loss, extra):
    seen: list[tuple[int, ...]] = []
    forward = InfoNCELoss.forward

    def spy(self, query, positive, negatives=None, teacher_scores=None):
        seen.append(tuple(teacher_scores.shape))
        return forward(self, query, positive, negatives, teacher_scores)

    monkeypatch.setattr(InfoNCELoss, "forward", spy)
    cfg = make_cfg(["debug=fast", "logger=none", f"loss={loss}", "data=jsonl",
                    f"data.train_file={_scored_file(tmp_path / 'scored.jsonl')}", "data.num_negatives=2",
                    "data.val_fraction=0.2", "trainer.limit_train_batches=6", *extra], output_dir=tmp_path / loss)
    train(cfg)
    metrics = json.loads((tmp_path / loss / "metrics.json").read_text())
    assert metrics["global_step"] == 6 and seen == [(8, 3)] * 6
    assert math.isfinite(metrics["train"]["train/loss"])
