"""Guided false-negative masking (``loss.guide``, GISTEmbed; gte_pro.training.guide and .partition): a worked example
by hand, values and gradients against term-by-term references, off = the plain loss bit for bit, exact under 2 gloo
ranks and under GradCache, the guide's input (the batch's token ids, or the decoded texts re-tokenized), bad values
refused by the config check before any model loads, and a short run that trains with a guide and logs its share."""

from __future__ import annotations

import csv
import json
import math

import pytest
import torch
import torch.nn.functional as F

from gte_pro.config.checks import config_problems
from gte_pro.config.defaults import default_loss
from gte_pro.training.losses import GTELoss, InfoNCELoss
from gte_pro.training.telemetry import step_telemetry
from tests.test_losses import _unit
from tests.test_partition import _inputs

TAU = 0.05


def _guide_inputs(num_negatives: int, batch: int = 6, dim: int = 16):
    """The guide's embeddings of the same texts: unit vectors of its own space, with a duplicate pair of its own."""
    q, pos = _unit(batch, dim, seed=31).detach(), _unit(batch, dim, seed=32).detach()
    neg = _unit(batch, num_negatives, dim, seed=33).detach() if num_negatives else None
    pos[4] = pos[5]  # the guide reads rows 4 and 5 as the same document: each is the other's false negative
    return q, pos, neg


def reference_guided_ce(terms, guide_terms, positive: int, tau: float, margin: float, fn_margin: float | None):
    """One row's loss from its raw similarities, term by term: a term leaves the denominator when the guide scores
    it above its positive minus ``margin`` (GISTEmbed, sentence-transformers' absolute margin), or when the student
    scores it above its positive plus ``fn_margin`` (loss.false_negative_margin)."""
    s_pos, g_pos = terms[positive], guide_terms[positive].item()
    kept = [s for j, (s, g) in enumerate(zip(terms, guide_terms, strict=True)) if j != positive
            and not g.item() > g_pos - margin and not (fn_margin is not None and s.item() > s_pos.item() + fn_margin)]
    denominator = torch.exp(s_pos / tau) + sum(torch.exp(s / tau) for s in kept)
    return -(s_pos / tau - torch.log(denominator))


def _terms(q, pos, neg, gte: bool):
    """Each row's terms, positive first in the candidates' order: InfoNCE's, or GTE's four kinds (self-terms out)."""
    n = len(q)
    docs = list(pos) + ([d for row in neg for d in row] if neg is not None else [])
    rows = []
    for i in range(n):
        terms = [torch.dot(q[i], d) for d in docs]
        if gte:
            terms += [torch.dot(q[i], q[j]) for j in range(n) if j != i]
            terms += [torch.dot(q[j], pos[i]) for j in range(n) if j != i]
            terms += [torch.dot(d, pos[i]) for j, d in enumerate(docs) if j != i]
        rows.append(terms)
    return rows


def reference(student, guide, tau, margin, fn_margin=None, gte=False):
    rows = zip(_terms(*student, gte), _terms(*guide, gte), strict=True)
    losses = [reference_guided_ce(s, g, i, tau, margin, fn_margin) for i, (s, g) in enumerate(rows)]
    return sum(losses) / len(losses)


def test_a_worked_example_by_hand():
    """One query; student cosines: positive 0.5, candidates 0.7, 0.4, 0.2; the guide's: positive 0.6, candidates
    0.8, 0.9, 0.1. The guide masks the first two (it scores them above the positive); the student's own 0.7 it
    would have kept and its 0.4 it would never have flagged."""
    tau = 0.1
    student = torch.tensor([[0.5, math.sqrt(0.75)], [0.7, math.sqrt(0.51)], [0.4, math.sqrt(0.84)],
                            [0.2, math.sqrt(0.96)]], dtype=torch.float64)
    guide = torch.tensor([[0.6, 0.8], [0.8, 0.6], [0.9, math.sqrt(0.19)], [0.1, math.sqrt(0.99)]], dtype=torch.float64)
    query = torch.tensor([[1.0, 0.0]], dtype=torch.float64)

    def loss(**options):
        return default_loss("infonce", temperature=tau, guide="g", **options)(
                            query, student[:1], student[1:][None], guide=(query, guide[:1], guide[1:][None]))

    out = loss()
    assert out.loss.item() == pytest.approx(-math.log(math.exp(5) / (math.exp(5) + math.exp(2))), rel=1e-12)
    assert out.guide_masked_share.item() == pytest.approx(2 / 3) and out.masked_share is None
    # sentence-transformers' sign: masked when g_ij > g_i+ - margin, so a larger margin masks more ...
    assert loss(guide_margin=0.55).loss.item() == 0.0 and loss(guide_margin=0.55).guide_masked_share.item() == 1.0
    # ... and a negative one only what the guide scores clearly above the positive (0.9 > 0.6 + 0.25)
    kept = loss(guide_margin=-0.25)
    assert kept.loss.item() == pytest.approx(
        -math.log(math.exp(5) / (math.exp(5) + math.exp(7) + math.exp(2))), rel=1e-12)
    # with false-negative masking too: each decides on the unmasked scores, the union leaves, each reports its own
    both = loss(guide_margin=-0.25, false_negative_margin=0.1)
    assert both.loss.item() == pytest.approx(-math.log(math.exp(5) / (math.exp(5) + math.exp(2))), rel=1e-12)
    assert both.masked_share.item() == pytest.approx(1 / 3) and both.guide_masked_share.item() == pytest.approx(1 / 3)
    figures = step_telemetry(both.scores, both.labels, None, None, 3, None, both.masked_share,
                             both.guide_masked_share)
    assert figures["telemetry/guide_masked_share"] == pytest.approx(1 / 3)
    assert figures["telemetry/masked_share"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("num_negatives", [0, 2])
@pytest.mark.parametrize(("margin", "fn_margin"), [(0.0, None), (0.1, None), (-0.2, None), (0.0, 0.1)])
@pytest.mark.parametrize("loss_name", ["infonce", "gte"])
def test_values_and_gradients_match_the_reference(loss_name, margin, fn_margin, num_negatives):
    q, pos, neg = _inputs(num_negatives)
    guide = _guide_inputs(num_negatives)
    inputs = [t for t in (q, pos, neg) if t is not None]
    cls = {"infonce": InfoNCELoss, "gte": GTELoss}[loss_name]
    loss = default_loss(cls, temperature=TAU, guide="g", guide_margin=margin, false_negative_margin=fn_margin)
    out = loss(q, pos, neg, guide=guide)
    unit = [None if t is None else F.normalize(t, dim=-1) for t in (q, pos, neg)]
    theirs = reference(unit, guide, TAU, margin, fn_margin, gte=loss_name == "gte")
    assert out.loss.item() == pytest.approx(theirs.item(), rel=1e-9)
    assert out.guide_masked_share.item() > 0
    for mine, ref in zip(torch.autograd.grad(out.loss, inputs), torch.autograd.grad(theirs, inputs), strict=True):
        torch.testing.assert_close(mine, ref, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_off_is_the_plain_loss_bit_for_bit(loss_cls):
    q, pos, neg = _inputs(2)
    plain = default_loss(loss_cls, temperature=TAU)(q, pos, neg)
    # the key set but no guide embeddings handed in (a loss built outside a training step): nothing changes
    named = default_loss(loss_cls, temperature=TAU, guide="g")(q, pos, neg)
    assert torch.equal(plain.loss, named.loss) and named.guide_masked_share is None
    # a guide that masks nothing (a margin no cosine can clear): the same loss and gradients, bit for bit
    quiet = default_loss(loss_cls, temperature=TAU, guide="g", guide_margin=-3.0)(q, pos, neg, guide=_guide_inputs(2))
    assert torch.equal(plain.loss, quiet.loss) and quiet.guide_masked_share.item() == 0.0
    for a, b in zip(torch.autograd.grad(plain.loss, [q, pos, neg]), torch.autograd.grad(quiet.loss, [q, pos, neg]),
                    strict=True):
        assert torch.equal(a, b)


def test_the_guide_masks_every_width_and_the_distillation_losses_in_batch_term():

    q, pos, neg = _inputs(2)
    guide = _guide_inputs(2)
    options = {"guide": "g", "temperature": TAU}
    both = default_loss("infonce", matryoshka_dims=[16, 8], **options)(q, pos, neg, guide=guide)
    wide = default_loss("infonce", **options)(q, pos, neg, guide=guide)
    # the guide at its own width
    narrow = default_loss("infonce", **options)(q[:, :8], pos[:, :8], neg[..., :8], guide=guide)
    assert both.loss.item() == pytest.approx(wide.loss.item() + narrow.loss.item(), rel=1e-12)
    teacher = torch.rand(6, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    plain_kl = default_loss("distill_kl", temperature=TAU, teacher_temperature=1.0)(q, pos, neg, teacher)
    guided_kl = default_loss("distill_kl", temperature=TAU, teacher_temperature=1.0, guide="g")(q, pos, neg, teacher,
                             guide)
    plain = default_loss("infonce", temperature=TAU)(q, pos, neg).loss
    assert (guided_kl.loss - plain_kl.loss).item() == pytest.approx((wide.loss - plain).item(), rel=1e-9)


# --- exact under DDP (2 gloo ranks = 1 process on the whole batch) and under GradCache ----------------------------
BATCH, NEGATIVES, DIM = 6, 2, 8
OPTIONS = {f"{name}-g{margin}-m{fn}": (name, margin, fn) for name in ("infonce", "gte")
           for margin, fn in ((0.0, None), (0.1, None), (0.0, 0.05))}


def _loss_and_grads(rows: slice, name: str, margin: float, fn_margin: float | None):
    q, pos, neg = (t[rows].clone().requires_grad_(True) for t in _inputs(NEGATIVES, BATCH, DIM))
    guide = tuple(t[rows] for t in _guide_inputs(NEGATIVES, BATCH, DIM))
    cls = {"infonce": InfoNCELoss, "gte": GTELoss}[name]
    loss = default_loss(cls, temperature=TAU, guide="g", guide_margin=margin, false_negative_margin=fn_margin)(
        q, pos, neg, guide=guide).loss
    return loss, list(torch.autograd.grad(loss, [q, pos, neg]))


def test_two_ranks_equal_one_process_on_the_whole_batch(tmp_path):
    from tests.ddp_harness import assert_ranks_equal_one_process

    distributed = assert_ranks_equal_one_process(tmp_path, BATCH, OPTIONS, _loss_and_grads)
    # a guide seen only on this rank's rows would mask other candidates: the whole batch's guide is what counts
    local, _ = _loss_and_grads(slice(0, BATCH // 2), "infonce", 0.0, None)
    assert local.item() != pytest.approx(distributed["infonce-g0.0-mNone"]["loss"].item(), rel=1e-6)


@pytest.mark.parametrize("loss_cls", [InfoNCELoss, GTELoss])
def test_gradcache_gives_the_full_batchs_loss_and_gradients(loss_cls):
    from gte_pro.training.gradcache import cached_loss
    from gte_pro.training.losses import split_documents
    from tests.test_losses import _BagOfTokens, _tokens

    torch.manual_seed(0)
    encoder, guide_encoder = _BagOfTokens(), _BagOfTokens()
    queries, docs = _tokens(BATCH, seed=1), _tokens(BATCH * (1 + NEGATIVES), seed=2)
    with torch.no_grad():  # the guide's embeddings of the whole batch, once
        guide = (guide_encoder(**queries), *split_documents(guide_encoder(**docs), BATCH, NEGATIVES))
    loss_fn = default_loss(loss_cls, temperature=TAU, guide="g", hardness_alpha=5.0)
    full = loss_fn(encoder(**queries), *split_documents(encoder(**docs), BATCH, NEGATIVES), guide=guide)
    full.loss.backward()
    full_grad = encoder.embed.weight.grad.clone()
    encoder.zero_grad()
    cached = cached_loss(encoder, loss_fn, queries, docs, NEGATIVES, mini_batch_size=4, guide=guide)
    cached.loss.backward()
    assert cached.loss.item() == pytest.approx(full.loss.item(), rel=1e-12)
    assert cached.guide_masked_share.item() == full.guide_masked_share.item() > 0
    torch.testing.assert_close(encoder.embed.weight.grad, full_grad, rtol=1e-10, atol=1e-12)
    assert guide_encoder.embed.weight.grad is None  # the guide is never trained


# --- the guide's input: the batch's token ids, or the decoded texts tokenized again ------------------------------
TEXTS = ["How do I sort a list in Python?", "sorted(iterable) returns a new sorted list.", "Open a file with open()."]


def test_the_guide_reads_the_batchs_ids_or_re_tokenizes_the_decoded_texts():
    from transformers import AutoTokenizer

    from gte_pro.models.tiny_tokenizer import tiny_bpe_tokenizer
    from gte_pro.training.gradcache import split_features
    from gte_pro.training.guide import Guide
    from tests.ddp_harness import tiny_encoder

    guide_encoder = tiny_encoder()  # MiniLM's tokenizer, random weights
    shared = Guide(guide_encoder, guide_encoder.tokenizer)
    features = guide_encoder.tokenize(TEXTS)
    assert shared.shares_tokens and shared.features(features) == {k: features[k] for k in shared.features(features)}
    assert not any(p.requires_grad for p in shared.encoder.parameters()) and not shared.encoder.training
    # another vocabulary (a byte-level BPE student): the student's ids decoded, then the guide's own tokens
    student = AutoTokenizer.from_pretrained(tiny_bpe_tokenizer())
    other = Guide(guide_encoder, student)
    student_features = dict(student(TEXTS, padding=True, return_tensors="pt"))
    assert not other.shares_tokens
    for key, value in other.features(student_features).items():
        assert torch.equal(value, features[key]), key
    # embedded in the student's GradCache chunks or in one pass: the same unit vectors (to rounding)
    whole, chunked = shared.embed(features), shared.embed(features, chunk=2)
    torch.testing.assert_close(whole, chunked, rtol=1e-12, atol=1e-12)
    assert torch.allclose(whole.norm(dim=-1), torch.ones(3, dtype=whole.dtype))
    assert len(split_features(features, 2)) == 2
    # a guide that reads fewer tokens than the student passes tokenizes again (sentence-transformers' rule too)
    longer = guide_encoder.max_length + 1
    assert not Guide(guide_encoder, guide_encoder.tokenizer, student_max_length=longer).shares_tokens


# --- bad values end in the config check, before any model loads ---------------------------------------------------
def _classifier_folder(tmp_path):
    folder = tmp_path / "reranker"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    return folder


@pytest.mark.parametrize(("overrides", "problem"), [
    (["loss.guide=123"], "loss.guide=123: expected a non-empty string or null"),
    (["loss=gte", "loss.guide=''"], "loss.guide='': expected a non-empty string or null"),
    (["loss.guide=/no/such/guide"], "loss.guide=/no/such/guide: no such folder"),
    (["loss.guide=./missing-guide"], "loss.guide=./missing-guide: no such folder"),
    (["loss.guide=nobody/no-such-model"], "loss.guide=nobody/no-such-model: neither a folder nor a hub model"),
    (["loss.guide={reranker}"], "loss.guide={reranker}: a cross-encoder (BertForSequenceClassification"),
    (["loss.guide={empty}"], "loss.guide={empty}: not a model folder (no"),
    (["loss.guide_margin=0.1"], "loss.guide_margin=0.1: set but loss.guide is null"),
    (["loss.guide_margin=inf"], "loss.guide_margin=inf: expected a number"),
    (["loss=margin_mse", "loss.guide={minilm}"], "loss.guide={minilm}: loss=margin_mse with loss.weight_infonce=0"),
])
def test_bad_values_are_named_by_the_config_check(make_cfg, tmp_path, monkeypatch, overrides, problem):
    from gte_pro import packaged_minilm_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "empty").mkdir()
    names = {"reranker": _classifier_folder(tmp_path), "empty": tmp_path / "empty", "minilm": packaged_minilm_path()}
    problems = config_problems(make_cfg([o.format(**names) for o in overrides]))
    assert any(p.startswith(problem.format(**names)) for p in problems), problems


def test_a_bad_guide_is_two_lines_and_a_good_one_passes(make_cfg, tmp_path):
    from gte_pro import packaged_minilm_path
    from gte_pro.config.checks import check_config
    from gte_pro.errors import ConfigError, explain

    with pytest.raises(ConfigError) as caught:
        check_config(make_cfg([f"loss.guide={_classifier_folder(tmp_path)}"]))
    what, fix = explain(caught.value)
    assert "loss.guide=" in what and "cross-encoder" in what and "\n" not in what + fix
    assert fix.startswith("give loss.guide an embedder's folder or hub name")
    assert config_problems(make_cfg([f"loss.guide={packaged_minilm_path()}", "loss.guide_margin=0.05"])) == []


# --- a short run ---------------------------------------------------------------------------------------------------
def test_a_short_run_trains_with_a_guide_and_logs_its_share(make_cfg, tmp_path, pairs_file):
    """The tiny random BERT guided by the packaged MiniLM (the same vocabulary: the batch's ids), under GradCache:
    the share is logged at the due steps, the guide stays out of the checkpoint, and the weights moved."""
    from gte_pro import packaged_minilm_path
    from gte_pro.train import train

    out = tmp_path / "run"
    cfg = make_cfg(["debug=fast", "logger=csv", "data=jsonl", f"data.train_file={pairs_file}", "data.num_negatives=2",
                    "data.val_fraction=0.2", f"loss.guide={packaged_minilm_path()}", "loss.mini_batch_size=4",
                    "trainer.limit_train_batches=4", "eval.telemetry_every_n_steps=2", "eval.before=false",
                    "export.hf=false", "export.model_card=false"], output_dir=out)
    train(cfg)
    with open(out / "csv" / "version_0" / "metrics.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("telemetry/guide_masked_share")]
    assert sorted(int(row["step"]) for row in rows) == [1, 3]
    assert all(0 <= float(row["telemetry/guide_masked_share"]) <= 1 for row in rows)
    assert "telemetry/masked_share" not in rows[0] or not rows[0]["telemetry/masked_share"]
    state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=True)
    assert not any("guide" in key for key in state["state_dict"])
    assert state["gte_pro_module_config"]["loss"]["guide"] == packaged_minilm_path()


# --- kill-resume: the guide is frozen and keeps no state, so a stopped and resumed run ends as an uninterrupted one --
@pytest.mark.slow
def test_a_guided_run_stopped_mid_epoch_resumes_bit_identical(make_cfg, tmp_path):
    from gte_pro import packaged_minilm_path
    from tests.test_resume import RUN, stop_at_step_7_and_resume

    stop_at_step_7_and_resume(make_cfg, tmp_path, [*RUN, f"loss.guide={packaged_minilm_path()}"])
