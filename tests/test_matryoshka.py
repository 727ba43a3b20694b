"""Matryoshka embeddings: the loss over truncated embeddings, validation per dimension, and an export that
sentence-transformers reproduces at each dimension with ``truncate_dim``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.defaults import default_loss
from gte_pro.data.beir import load_beir
from gte_pro.train import train
from gte_pro.training.losses import GTELoss, InfoNCELoss
from tests.beir_data import st_evaluator_metrics, write_beir_folder


def _embeddings(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_the_loss_is_the_weighted_sum_over_truncated_embeddings(loss_cls):
    q, pos, neg = _embeddings(1, 6, 32), _embeddings(2, 6, 32), _embeddings(3, 6, 2, 32)
    dims, weights = [32, 16, 8], [1.0, 0.5, 2.0]
    ours = default_loss(loss_cls, matryoshka_dims=dims, matryoshka_weights=weights)(q, pos, neg)
    plain = default_loss(loss_cls)
    expected = sum(w * plain(q[:, :d], pos[:, :d], neg[..., :d]).loss for d, w in zip(dims, weights, strict=True))
    assert ours.loss.item() == pytest.approx(expected.item(), rel=1e-12)
    torch.testing.assert_close(torch.autograd.grad(ours.loss, q)[0], torch.autograd.grad(expected, q)[0])
    # the train metrics' scores are the full embedding's: cosines of the whole vectors
    full = F.normalize(q, dim=-1) @ F.normalize(pos, dim=-1).T
    torch.testing.assert_close(ours.scores[:, :6], full.detach())


@pytest.mark.parametrize(("loss_cls", "gathers"), [(InfoNCELoss, 2), (GTELoss, 3)])
def test_the_embeddings_are_gathered_once_at_full_width(monkeypatch: pytest.MonkeyPatch, loss_cls, gathers: int):
    """Under DDP each gather is a collective: positives, negatives (and gte's queries) once a step, not once per
    Matryoshka dimension."""
    import gte_pro.training.losses.contrastive as losses

    calls = []
    monkeypatch.setattr(losses, "gather_with_grad", lambda x: (calls.append(x.shape[-1]), (x, 0))[1])
    q, pos, neg = _embeddings(1, 6, 32), _embeddings(2, 6, 32), _embeddings(3, 6, 2, 32)
    default_loss(loss_cls, matryoshka_dims=[32, 16, 8, 4])(q, pos, neg)
    assert calls == [32] * gathers


def test_matryoshka_settings_are_checked():
    with pytest.raises(ValueError, match=r"matryoshka_dims=\[64\]: 64 is larger than the model's embedding "
                                         r"dimension 32"):
        default_loss("infonce", matryoshka_dims=[64])(torch.randn(4, 32), torch.randn(4, 32))


def test_validation_per_dimension_is_what_sentence_transformers_gives_with_truncate_dim(make_cfg, tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    beir = write_beir_folder(tmp_path / "scifake")
    cfg = make_cfg(["debug=fast", "logger=none", "loss.matryoshka_dims=[64,32,16]", f"eval.beir=[{beir}]"],
                   output_dir=tmp_path / "run")
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())["val"]
    assert {"val/dim32/ndcg@10", "val/dim16/ndcg@10", "val/scifake/dim16/ndcg@10"} <= set(metrics)
    assert "val/dim64/ndcg@10" not in metrics  # the full dimension is val/ndcg@10 itself
    for dim in (32, 16):
        model = SentenceTransformer(str(tmp_path / "run" / "model"), device="cpu", truncate_dim=dim)
        theirs = st_evaluator_metrics(model, load_beir(beir, "test"))
        ours = {name: metrics[f"val/scifake/dim{dim}/{name}"] for name in theirs}
        assert ours == pytest.approx(theirs, abs=1e-4)
    card = (tmp_path / "run" / "model" / "README.md").read_text()
    assert "| matryoshka dims | [64, 32, 16] |" in card and "truncate_dim=16" in card and "| scifake/dim16 |" in card


def test_truncated_dims_are_evaluated_without_matryoshka_training_too(make_cfg, tmp_path: Path):
    cfg = make_cfg(["mode=eval", "debug=fast", "eval.truncate_dims=[32,8]"], output_dir=tmp_path / "eval")
    train(cfg)
    sets = json.loads((tmp_path / "eval" / "metrics.json").read_text())["sets"]
    assert {"held-out", "dim32", "dim8"} <= set(sets)
    assert sets["dim8"]["metrics"]["ndcg@10"] != sets["held-out"]["metrics"]["ndcg@10"]
