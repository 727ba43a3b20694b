"""Quantization-aware training (``loss.quantization_aware``): the quantized terms see ``eval.quantization``'s values,
their straight-through gradients reach the embeddings, the int8 ranges live in the checkpoint, GradCache gives the
same loss and gradients, and the export's ``quantization.json`` quantizes as sentence-transformers does."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.defaults import default_loss
from gte_pro.evaluation.quantize import quantize
from gte_pro.export.quantization import QUANTIZATION_FILE, load_quantization
from gte_pro.train import train
from gte_pro.training.gradcache import cached_loss
from gte_pro.training.losses import split_documents
from gte_pro.training.losses.quantization_aware import RANGE_MOMENTUM
from tests.test_gradcache import _batch, _encoder, _take_grads

DIM = 32


def _embeddings(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).requires_grad_()


def _triple() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _embeddings(1, 6, DIM), _embeddings(2, 6, DIM), _embeddings(3, 6, 2, DIM)


def test_without_quantization_the_loss_is_plain_infonce_bit_for_bit():
    q, pos, neg = _triple()
    docs = torch.cat([pos, neg.reshape(-1, DIM)])
    expected = F.cross_entropy(F.normalize(q, dim=-1) @ F.normalize(docs, dim=-1).T / 0.05, torch.arange(6))
    for loss in (default_loss("infonce"), default_loss("infonce", quantization_aware=[])):
        assert torch.equal(loss(q, pos, neg).loss, expected)
        assert "quantization_ranges" not in loss.state_dict()  # other runs' checkpoints are unchanged


def test_the_binary_term_is_infonce_over_the_evaluated_bits_and_its_gradient_reaches_the_embeddings():
    q, pos, neg = _triple()
    qat = default_loss("infonce", quantization_aware=["binary"], quantization_weight=0.5)
    term = (qat(q, pos, neg).loss - default_loss("infonce")(q, pos, neg).loss) / 0.5
    docs = torch.cat([pos, neg.reshape(-1, DIM)])
    bits_q, bits_d = quantize(q.detach(), "binary"), quantize(docs.detach(), "binary")  # eval.quantization's values
    expected = F.cross_entropy((bits_q @ bits_d.T / DIM).double() / 0.05, torch.arange(6))
    assert term.item() == pytest.approx(expected.item(), rel=1e-6)
    grad = torch.autograd.grad(term, q)[0]
    assert grad.abs().sum() > 0 and torch.isfinite(grad).all()


def test_the_int8_term_ranks_by_the_evaluated_int8_inner_products():
    q, pos, neg = _triple()
    qat = default_loss("infonce", quantization_aware=["int8"])
    term = qat(q, pos, neg).loss - default_loss("infonce")(q, pos, neg).loss
    docs = torch.cat([pos, neg.reshape(-1, DIM)]).detach()
    ranges = torch.stack([docs.min(0).values, docs.max(0).values]).float()  # first step: the batch's own ranges
    assert torch.equal(qat.quantization_ranges, ranges)
    q8, d8 = quantize(q.detach(), "int8", ranges), quantize(docs, "int8", ranges)
    scale = d8.norm(dim=-1).mean()
    expected = F.cross_entropy((q8 @ d8.T / scale**2).double() / 0.05, torch.arange(6))
    assert term.item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.autograd.grad(term, pos)[0].abs().sum() > 0


def test_a_constant_dimension_keeps_the_int8_gradient_finite():
    """all-MiniLM-L6-v2 has a dimension whose range over a batch is ~1e-32: the step's inverse must not reach the
    gradient (the forward values stay eval.quantization's)."""
    q, pos, neg = (x.detach().clone() for x in _triple())
    for x in (q, pos, neg):
        x[..., 0] = 1e-33 * torch.randn(x.shape[:-1], generator=torch.Generator().manual_seed(0), dtype=x.dtype)
    q.requires_grad_()
    loss = default_loss("infonce", quantization_aware=["int8"])
    grad = torch.autograd.grad(loss(q, pos, neg).loss, q)[0]
    plain = torch.autograd.grad(default_loss("infonce")(q, pos, neg).loss, q)[0]
    # unbounded, that dimension's gradient was ~1e35 and its square (the gradient norm) inf
    assert torch.isfinite(grad).all() and 0 < grad.abs().max() < 100 * plain.abs().max()


def test_the_ranges_are_a_moving_average_kept_in_the_state_dict():
    loss = default_loss("infonce", quantization_aware=["int8", "binary"])
    first, second = _triple(), (_embeddings(4, 6, DIM), _embeddings(5, 6, DIM), None)
    loss(*first)
    after_one = loss.quantization_ranges.clone()
    with torch.no_grad():  # validation does not move the ranges
        loss(*second)
    assert torch.equal(loss.quantization_ranges, after_one)
    loss(*second)
    batch = torch.stack([second[1].min(0).values, second[1].max(0).values]).detach().float()
    torch.testing.assert_close(loss.quantization_ranges, RANGE_MOMENTUM * after_one + (1 - RANGE_MOMENTUM) * batch)
    # fresh: (2, 0) until it loads the checkpoint's (2, dim)
    resumed = default_loss("gte", quantization_aware=["binary"])
    resumed.load_state_dict(loss.state_dict())
    assert torch.equal(resumed.quantization_ranges, loss.quantization_ranges)


def test_matryoshka_adds_the_quantized_terms_at_the_full_width_only():
    q, pos, neg = _triple()
    both = default_loss("infonce", matryoshka_dims=[DIM, 8], quantization_aware=["binary"])(q, pos, neg).loss
    matryoshka = default_loss("infonce", matryoshka_dims=[DIM, 8])(q, pos, neg).loss
    quantized, plain = default_loss("infonce", quantization_aware=["binary"]), default_loss("infonce")
    binary = quantized(q, pos, neg).loss - plain(q, pos, neg).loss
    assert both.item() == pytest.approx((matryoshka + binary).item(), rel=1e-12)


def test_gradcache_gives_the_same_quantization_aware_loss_and_gradients():
    encoder = _encoder()
    batch = _batch(encoder)

    def step(cached: bool) -> tuple[float, dict]:
        loss_fn = default_loss("infonce", quantization_aware=["binary", "int8"])
        if cached:
            out = cached_loss(encoder, loss_fn, batch["query"], batch["doc"], batch["num_negatives"], 4)
        else:
            query, docs = encoder(**batch["query"]), encoder(**batch["doc"])
            out = loss_fn(query, *split_documents(docs, query.shape[0], batch["num_negatives"]))
        out.loss.backward()
        return out.loss.item(), _take_grads(encoder)

    (cached, cached_grads), (full, full_grads) = step(True), step(False)
    assert cached == pytest.approx(full, rel=1e-6)
    for name, grad in full_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)


def test_unknown_precisions_name_the_valid_ones(make_cfg):
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError

    check_config(make_cfg(["loss.quantization_aware=[binary,int8]", "loss.quantization_weight=0.5"]))
    with pytest.raises(ConfigError, match=r"loss.quantization_aware=\['int4'\]: expected a list of distinct values "
                                          r"of: int8, binary"):
        check_config(make_cfg(["loss.quantization_aware=[int4]"]))


def test_a_run_exports_its_ranges_and_sentence_transformers_quantizes_the_same_way(make_cfg, tmp_path: Path):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.util.quantization import quantize_embeddings

    cfg = make_cfg(["debug=fast", "logger=none", "loss.quantization_aware=[binary,int8]",
                    "eval.quantization=[int8,binary]"], output_dir=tmp_path / "run")
    train(cfg)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert {"val/ndcg@10_int8", "val/ndcg@10_binary"} <= set(metrics["val"])
    model_dir = tmp_path / "run" / "model"
    assert metrics["quantization_file"] == str(model_dir / QUANTIZATION_FILE)
    settings = load_quantization(model_dir)
    model = SentenceTransformer(str(model_dir), device="cpu")
    embeddings = model.encode([f"text number {i} about topic {i % 3}" for i in range(40)])
    assert settings["int8_ranges"].shape == (2, embeddings.shape[1]) and settings["binary_threshold"] == 0
    assert settings["trained_for"] == ["binary", "int8"]
    assert np.all(settings["int8_ranges"][0] < settings["int8_ranges"][1])
    ours = quantize(torch.from_numpy(embeddings), "int8", torch.from_numpy(settings["int8_ranges"]))
    theirs = quantize_embeddings(embeddings, precision="int8", ranges=settings["int8_ranges"])
    assert torch.equal(ours, torch.from_numpy(theirs).float())
    assert len(np.unique(theirs)) > 20  # real use of the int8 range, not all values clipped to the ends
    bits = quantize(torch.from_numpy(embeddings), "binary") > 0
    packed = np.packbits(bits.numpy(), axis=-1)
    assert np.array_equal(quantize_embeddings(embeddings, precision="ubinary"), packed)
    assert np.array_equal(quantize_embeddings(embeddings, precision="binary"), (packed.astype(np.int16) - 128)
                          .astype(np.int8))
    assert math.isfinite(metrics["val"]["val/ndcg@10_binary"])


@pytest.mark.slow  # three short training runs
def test_a_killed_quantization_aware_run_resumes_bit_identical_ranges_and_weights(make_cfg, tmp_path: Path):
    from tests.test_resume import RUN, stop_at_step_7_and_resume

    stop_at_step_7_and_resume(make_cfg, tmp_path, [*RUN, "loss.quantization_aware=[binary,int8]"])
    saved = torch.load(tmp_path / "stopped" / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]
    assert saved["loss.quantization_ranges"].shape[0] == 2 and saved["loss.quantization_ranges"].shape[1] > 0
