"""The losses against hand-written, loop-based references: values and gradients."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.defaults import default_loss
from gte_pro.training.losses import GTELoss, InfoNCELoss


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


def reference_gte(q, pos, neg, tau, mask_own_negatives=False, double_count_positive=False):
    """Li et al. 2023, eq. 3, written term by term, without the positive's second appearance (doc->query j == i)
    unless ``double_count_positive``; ``mask_own_negatives`` leaves d_i's own hard negatives out of doc->doc."""
    n = len(q)
    owners = list(range(n)) + ([i for i, row in enumerate(neg) for _ in row] if neg is not None else [])
    docs = [pos[j] for j in range(n)] + ([d for row in neg for d in row] if neg is not None else [])
    total = 0.0
    for i in range(n):
        terms = [torch.dot(q[i], d) / tau for d in docs]  # q_i -> all documents
        terms += [torch.dot(q[i], q[j]) / tau for j in range(n) if j != i]  # q_i -> other queries
        terms += [torch.dot(q[j], pos[i]) / tau for j in range(n) if j != i or double_count_positive]  # queries -> d_i
        for j, d in enumerate(docs):  # other documents -> d_i
            if j != i and not (mask_own_negatives and owners[j] == i):
                terms.append(torch.dot(d, pos[i]) / tau)
        total = total - (torch.dot(q[i], pos[i]) / tau - torch.logsumexp(torch.stack(terms), 0))
    return total / n


def _check_against_reference(ours_fn, reference_fn, num_negatives: int, batch: int = 6, dim: int = 16) -> None:
    """Raw (not unit) embeddings in; the reference scores their cosines, so gradients pass through the norm."""
    q, pos = _unit(batch, dim, seed=1) * 3, _unit(batch, dim, seed=2) * 0.5
    neg = _unit(batch, num_negatives, dim, seed=3) * 2 if num_negatives else None
    inputs = [t for t in (q, pos, neg) if t is not None]
    ours = ours_fn(q, pos, neg).loss
    grads = torch.autograd.grad(ours, inputs)
    ref = reference_fn(*(None if t is None else F.normalize(t, dim=-1) for t in (q, pos, neg)))
    ref_grads = torch.autograd.grad(ref, inputs)
    assert ours.item() == pytest.approx(ref.item(), rel=1e-6, abs=1e-8)
    for mine, theirs in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("num_negatives", [0, 2])
@pytest.mark.parametrize(
    "loss_cls,reference,tau", [(InfoNCELoss, reference_infonce, 0.05), (GTELoss, reference_gte, 0.02)]
)
def test_loss_matches_reference_values_and_gradients(loss_cls, reference, tau, num_negatives):
    _check_against_reference(default_loss(loss_cls, temperature=tau), lambda q, p, n: reference(q, p, n, tau),
                             num_negatives)


@pytest.mark.parametrize("num_negatives", [0, 1, 3])
@pytest.mark.parametrize("mask_own_negatives", [False, True])
def test_gte_options_match_the_reference(num_negatives, mask_own_negatives):
    _check_against_reference(default_loss("gte", temperature=0.05, mask_own_negatives=mask_own_negatives),
                             lambda q, p, n: reference_gte(q, p, n, 0.05, mask_own_negatives=mask_own_negatives),
                             num_negatives, batch=5)


def test_masking_own_negatives_changes_the_loss_only_when_there_are_negatives():
    q, pos, neg = _unit(4, 8, seed=6), _unit(4, 8, seed=7), _unit(4, 2, 8, seed=8)
    masked = default_loss("gte", temperature=0.05, mask_own_negatives=True)
    kept = default_loss("gte", temperature=0.05, mask_own_negatives=False)
    assert masked(q, pos).loss.item() == kept(q, pos).loss.item()
    # fewer terms in the partition function: strictly smaller
    assert masked(q, pos, neg).loss.item() < kept(q, pos, neg).loss.item() - 1e-6


@pytest.mark.parametrize("num_negatives", [0, 2])
def test_gte_has_no_ln2_floor(num_negatives):
    """Orthogonal texts, each query equal to its positive: every other term vanishes as the temperature falls, so
    the loss goes to 0. Counting the positive twice (the old form) leaves log 2 however well the batch is trained."""
    batch = 4
    basis = torch.eye(batch * (1 + num_negatives), dtype=torch.float64)
    q = pos = basis[:batch]
    neg = basis[batch:].reshape(batch, num_negatives, -1) if num_negatives else None
    values = [default_loss("gte", temperature=tau)(q, pos, neg).loss.item() for tau in (0.2, 0.1, 0.05, 0.01)]
    assert values == sorted(values, reverse=True) and values[-1] < 1e-12
    assert values[0] > 1e-3  # the limit is approached, not given
    old = reference_gte(q, pos, neg, 0.01, double_count_positive=True).item()
    assert old == pytest.approx(math.log(2), abs=1e-12)


def test_infonce_perfect_separation_is_near_zero_and_uniform_is_log_n():
    eye = torch.eye(4, dtype=torch.float64)
    assert default_loss("infonce", temperature=0.01)(eye, eye).loss.item() < 1e-6
    same = torch.ones(4, 3, dtype=torch.float64) / math.sqrt(3)
    assert default_loss("infonce", temperature=0.05)(same, same).loss.item() == pytest.approx(math.log(4))


def test_gte_loss_is_not_infonce():
    """The extra q->q, d->q and d->d terms must change the value (guards against a silent fallback)."""
    q, pos = _unit(5, 8, seed=4), _unit(5, 8, seed=5)
    gte, infonce = default_loss("gte", temperature=0.05), default_loss("infonce", temperature=0.05)
    assert gte(q, pos).loss.item() > infonce(q, pos).loss.item()


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_cosine_scoring_ignores_how_long_the_embeddings_are(loss_cls):
    """A model without a Normalize module hands the loss raw vectors: training must still score cosines."""
    q, pos, neg = _unit(6, 8, seed=7), _unit(6, 8, seed=8), _unit(6, 2, 8, seed=9)
    lengths = [torch.rand(*x.shape[:-1], 1, dtype=torch.float64, generator=torch.Generator().manual_seed(i)) * 9 + 1
               for i, x in enumerate((q, pos, neg))]
    raw = [x * length for x, length in zip((q, pos, neg), lengths, strict=True)]
    cosine = default_loss(loss_cls, temperature=0.05)(q, pos, neg)
    scaled = default_loss(loss_cls, temperature=0.05)(*raw)
    assert scaled.loss.item() == pytest.approx(cosine.loss.item(), rel=1e-9)
    torch.testing.assert_close(scaled.scores, cosine.scores)
    # similarity=dot scores the raw vectors as they come: the same inputs give another loss
    dot = default_loss(loss_cls, temperature=0.05, similarity="dot")(*raw)
    assert dot.loss.item() != pytest.approx(cosine.loss.item(), rel=1e-3)
    dot_normalised = default_loss(loss_cls, temperature=0.05, similarity="dot")(q, pos, neg)
    assert dot_normalised.loss.item() == pytest.approx(cosine.loss.item())


# --- DDP and GradCache: the own-negative columns are found in the gathered layout ---------------------------------
BATCH, NEGATIVES, DIM = 6, 2, 8  # global batch; 2 ranks x 3 queries
DDP_OPTIONS = {f"k{k}-mask{int(mask)}": (k, mask) for k in (0, NEGATIVES) for mask in (False, True)}


def _global_batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return (_unit(BATCH, DIM, seed=11).detach(), _unit(BATCH, DIM, seed=12).detach(),
            _unit(BATCH, NEGATIVES, DIM, seed=13).detach())


def _loss_and_grads(rows: slice, k: int, mask: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
    q, pos, neg = (t[rows].clone().requires_grad_(True) for t in _global_batch())
    inputs = [q, pos, neg[:, :k]] if k else [q, pos]
    loss = default_loss("gte", temperature=0.05, mask_own_negatives=mask)(*inputs).loss
    return loss, list(torch.autograd.grad(loss, [q, pos, neg] if k else [q, pos]))


def test_two_ranks_equal_one_process_on_the_concatenated_batch(tmp_path):
    """Each rank's loss is the mean over its 3 queries; the all_gather's backward sums what every rank's loss sends
    to an embedding, so a rank's gradient is world x that of the mean loss over all 6 queries."""
    from tests.conftest import free_port
    from tests.ddp_harness import loss_ranks_main, spawn_ranks

    out = tmp_path / "ddp.pt"
    spawn_ranks(loss_ranks_main, (2, free_port(), str(out), BATCH, DDP_OPTIONS, _loss_and_grads), tmp_path)
    distributed = torch.load(out)
    for name, (k, mask) in DDP_OPTIONS.items():
        loss, grads = _loss_and_grads(slice(0, BATCH), k, mask)
        assert distributed[name]["loss"].item() == pytest.approx(loss.item(), rel=1e-12), name
        for mine, theirs in zip(distributed[name]["grads"], grads, strict=True):
            torch.testing.assert_close(mine / 2, theirs, rtol=1e-10, atol=1e-12, msg=name)
    # the control: masking changed the value, so a wrong column would have shown
    assert distributed["k2-mask1"]["loss"].item() < distributed["k2-mask0"]["loss"].item() - 1e-6


class _BagOfTokens(torch.nn.Module):
    """A stand-in encoder (mean of token embeddings): GradCache only needs a module of the tokenized batch."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, DIM, dtype=torch.float64)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        mask = attention_mask[..., None].to(torch.float64)
        return F.normalize((self.embed(input_ids) * mask).sum(1) / mask.sum(1), dim=-1)


def _tokens(rows: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 7, (rows,), generator=g)
    return {"input_ids": torch.randint(0, 50, (rows, 6), generator=g),
            "attention_mask": (torch.arange(6) < lengths[:, None]).long()}


def test_gradcache_with_masked_own_negatives_equals_the_full_batch():
    from gte_pro.training.gradcache import cached_loss
    from gte_pro.training.losses import split_documents

    torch.manual_seed(0)
    encoder = _BagOfTokens()
    queries, docs = _tokens(BATCH, seed=1), _tokens(BATCH * (1 + NEGATIVES), seed=2)
    loss_fn = default_loss("gte", temperature=0.05, mask_own_negatives=True)
    full = loss_fn(encoder(**queries), *split_documents(encoder(**docs), BATCH, NEGATIVES)).loss
    full.backward()
    full_grad = encoder.embed.weight.grad.clone()
    encoder.zero_grad()
    cached = cached_loss(encoder, loss_fn, queries, docs, NEGATIVES, mini_batch_size=4)
    cached.loss.backward()
    assert cached.loss.item() == pytest.approx(full.item(), rel=1e-12)
    torch.testing.assert_close(encoder.embed.weight.grad, full_grad, rtol=1e-10, atol=1e-12)
    assert full_grad.abs().max() > 0


LOSS_OPTIONS = sorted(p.stem for p in (Path(__file__).resolve().parents[1] / "conf" / "loss").glob("*.yaml"))


@pytest.mark.parametrize("option", LOSS_OPTIONS)
def test_each_loss_is_a_module_of_its_own_with_its_formula_citation_and_own_parameters(option: str):
    """conf/loss/<option>.yaml targets a class of gte_pro.training.losses.<option>, whose docstrings give the formula
    (``L = ...``) and a citation (a year); its constructor names only what its bases do not, or a default of its own
    (GTE's temperature 0.02), and passes the rest on."""
    import inspect
    import re

    import yaml
    from hydra.utils import get_class

    target = yaml.safe_load((Path(__file__).resolve().parents[1] / "conf" / "loss" / f"{option}.yaml").read_text())
    loss_class = get_class(target["_target_"])
    module = inspect.getmodule(loss_class)
    assert module.__name__ == f"gte_pro.training.losses.{option}", module.__name__
    text = f"{module.__doc__}\n{loss_class.__doc__}"
    assert re.search(r"\bL = ", text) and re.search(r"\b(19|20)\d\d\b", text), f"{option}: no formula or citation"
    own = inspect.signature(loss_class.__init__).parameters if "__init__" in vars(loss_class) else {}
    for base in loss_class.__mro__[1:]:
        if "__init__" not in vars(base) or base.__module__.startswith("torch"):
            continue
        inherited = inspect.signature(base.__init__).parameters
        restated = [name for name, p in own.items() if name in inherited and name != "self"
                    and p.kind is not p.VAR_KEYWORD and p.default == inherited[name].default]
        assert not restated, f"{loss_class.__name__} restates {restated} of {base.__name__}"
