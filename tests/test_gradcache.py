"""GradCache (``loss.mini_batch_size``): the cached loss and every parameter gradient equal the uncached ones.

"Equal" is in float64 to 1e-5 (in practice ~1e-14: only the summation order differs). With dropout off the
reference is one uncached forward over the whole batch. With dropout on, masks depend on the RNG stream and on
the shapes they are drawn for, so the reference embeds the same chunks in the same order with gradients (what the
cached loss's first pass computes without them); the cached backward must reproduce it by restoring the RNG state.
Under Lightning the cached loss runs in the automatic loop: accumulation, clipping and DDP's single all-reduce per
step are checked against uncached runs on the same batches.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import logging
import math
import warnings
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch.strategies import FSDPStrategy
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import DataLoader

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_loss
from gte_pro.data.collate import PairCollator
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build import build_encoder, build_module, build_trainer
from gte_pro.train import train
from gte_pro.training import gradcache
from gte_pro.training.gradcache import cached_loss, cached_step, split_features
from gte_pro.training.losses import LossOutput, split_documents
from gte_pro.training.losses.partition import at_least_fp32
from gte_pro.training.module import ContrastiveModule

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
NEGATIVES = 2
# lengths vary, so that chunks are cut to different widths than the whole batch is padded to
ROWS = [(f"question {i} " + "about the subject " * (i % 4),
         f"an answer to question {i} " + "with more detail " * (2 * i % 7),
         [f"unrelated text {i}-{j} " * (j + 1) for j in range(NEGATIVES)]) for i in range(6)]


def _encoder(dropout: float = 0.0, dtype: torch.dtype = torch.float64) -> Encoder:
    torch.manual_seed(0)  # identical initial weights in every call (and every process)
    config = {**TINY, "hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    # one padded pass per forward: the bf16 test sums each forward's weight-cast gradients in a set order, which
    # length chunks inside a forward would regroup (tests/test_length_chunks.py covers chunks against one pass)
    return Encoder.load(packaged_minilm_path(), random_init_config=config, max_length=32, length_chunks=1).to(dtype)


def _batch(encoder: Encoder, negatives: int = NEGATIVES, rows: list = ROWS) -> dict[str, Any]:
    """The training batch exactly as the datamodule's collator builds it."""
    return PairCollator(encoder.tokenizer, encoder.max_length)([(q, p, n[:negatives]) for q, p, n in rows])


def _loss(name: str, **kwargs: Any):
    return default_loss(name, temperature=0.05, **kwargs)


def _full_batch_step(encoder: Encoder, loss_fn, batch: dict[str, Any]) -> LossOutput:
    """The uncached training step (ContrastiveModule.training_step): one forward over all queries and docs."""
    query, docs = encoder(**batch["query"]), encoder(**batch["doc"])
    out = loss_fn(query, *split_documents(docs, query.shape[0], batch["num_negatives"]))
    out.loss.backward()
    return out


def _chunked_step(encoder: Encoder, loss_fn, batch: dict[str, Any], mini_batch_size: int,
                  precision: contextlib.AbstractContextManager | None = None) -> LossOutput:
    """Uncached, but embedding the cached loss's chunks in its order (same RNG draws for the same shapes) under
    ``precision``, with the loss in fp32 as the cached loss computes it."""
    with precision or contextlib.nullcontext():
        query = torch.cat([encoder(**c) for c in split_features(batch["query"], mini_batch_size)])
        docs = torch.cat([encoder(**c) for c in split_features(batch["doc"], mini_batch_size)])
    query, docs = at_least_fp32(query), at_least_fp32(docs)
    out = loss_fn(query, *split_documents(docs, query.shape[0], batch["num_negatives"]))
    out.loss.backward()
    return out


def _take_grads(encoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    encoder.zero_grad(set_to_none=True)
    return grads


def _assert_same_grads(grads: dict, reference_grads: dict, tol: float = 1e-5) -> None:
    assert grads.keys() == reference_grads.keys() and len(reference_grads) > 10
    for name, grad in reference_grads.items():
        assert grad.abs().max() > 0, name  # a parameter the loss does not reach would make the check vacuous
        torch.testing.assert_close(grads[name], grad, atol=tol, rtol=tol, msg=name)


def _assert_same(cached: LossOutput, cached_grads: dict, reference: LossOutput, reference_grads: dict) -> None:
    assert cached.loss.item() == pytest.approx(reference.loss.item(), abs=1e-5, rel=1e-5)
    torch.testing.assert_close(cached.scores, reference.scores.detach(), atol=1e-5, rtol=1e-5)
    _assert_same_grads(cached_grads, reference_grads)


def test_split_documents_cuts_positives_and_per_query_negatives():
    docs = torch.arange(3 + 3 * 2, dtype=torch.float64)[:, None].expand(-1, 4)
    positives, negatives = split_documents(docs, 3, 2)
    assert positives[:, 0].tolist() == [0, 1, 2]
    assert negatives.shape == (3, 2, 4) and negatives[:, :, 0].tolist() == [[3, 4], [5, 6], [7, 8]]
    positives, negatives = split_documents(docs[:3], 3, 0)
    assert negatives is None and positives.shape == (3, 4)


# --- the algorithm, without Lightning ------------------------------------------------------------------------------
@pytest.mark.parametrize("mini_batch_size,num_negatives,name", [
    (4, 0, "infonce"), (4, NEGATIVES, "infonce"), (4, 0, "gte"), (4, NEGATIVES, "gte"),
    (1, NEGATIVES, "gte"), (64, NEGATIVES, "infonce"),  # one text per chunk; one chunk for all
])
def test_cached_loss_and_every_gradient_equal_the_full_batch_ones(mini_batch_size, num_negatives, name):
    encoder = _encoder()
    batch = _batch(encoder, num_negatives)
    reference = _full_batch_step(encoder, _loss(name), batch)
    reference_grads = _take_grads(encoder)

    calls: list[int] = []

    def counting_encoder(**features: torch.Tensor) -> torch.Tensor:
        calls.append(features["input_ids"].shape[0])
        return encoder(**features)

    cached = cached_loss(counting_encoder, _loss(name), batch["query"], batch["doc"], num_negatives,
                         mini_batch_size, params=encoder.parameters())
    texts = len(ROWS) * (2 + num_negatives)
    # the forward embeds every text once, without graphs; backward replays each chunk once more
    assert sum(calls) == texts and cached.loss.requires_grad
    assert all(p.grad is None for p in encoder.parameters())
    cached.loss.backward()
    _assert_same(cached, _take_grads(encoder), reference, reference_grads)
    # the memory claim, structurally: no encoder call sees more than M texts
    assert max(calls) <= mini_batch_size and sum(calls) == 2 * texts


def test_backward_scales_and_accumulates_like_any_loss():
    """What Lightning does to a loss (x 1/accumulate, x GradScaler's scale, summed over micro-batches) reaches
    the parameters through the replay."""
    encoder = _encoder()
    first, second = _batch(encoder, rows=ROWS[:3]), _batch(encoder, rows=ROWS[3:])
    for batch in (first, second):
        _full_batch_step(encoder, _loss("gte"), batch)  # gradients accumulate over both
    reference_grads = _take_grads(encoder)
    for batch in (first, second):
        out = cached_loss(encoder, _loss("gte"), batch["query"], batch["doc"], NEGATIVES, 2)
        (out.loss * 256.0 / 2).backward()
    _assert_same_grads({n: g * 2 / 256.0 for n, g in _take_grads(encoder).items()}, reference_grads)


@pytest.mark.parametrize("name", ["infonce", "gte"])
def test_with_dropout_restoring_the_rng_replays_the_same_masks(name, monkeypatch):
    encoder = _encoder(dropout=0.1)
    batch = _batch(encoder)
    torch.manual_seed(123)
    reference = _chunked_step(encoder, _loss(name), batch, 4)
    reference_grads = _take_grads(encoder)
    after_reference = torch.rand(3)
    torch.manual_seed(123)
    cached = cached_step(encoder, _loss(name), batch["query"], batch["doc"], NEGATIVES, 4)
    _assert_same(cached, _take_grads(encoder), reference, reference_grads)
    # the replay leaves the random stream where one forward leaves it
    assert torch.equal(torch.rand(3), after_reference)

    # the controls: dropout is really on (another seed, another loss) ...
    torch.manual_seed(124)
    other = cached_step(encoder, _loss(name), batch["query"], batch["doc"], NEGATIVES, 4)
    _take_grads(encoder)
    assert abs(other.loss.item() - reference.loss.item()) > 1e-4
    # ... and without the restore the replay draws new masks: the same loss, but gradients of another forward
    monkeypatch.setattr(gradcache.RngState, "restore", lambda self: None)
    torch.manual_seed(123)
    unrestored = cached_step(encoder, _loss(name), batch["query"], batch["doc"], NEGATIVES, 4)
    unrestored_grads = _take_grads(encoder)
    assert unrestored.loss.item() == pytest.approx(reference.loss.item(), abs=1e-10)
    assert max((unrestored_grads[n] - g).abs().max().item() for n, g in reference_grads.items()) > 1e-3


def test_backward_outside_bf16_autocast_replays_the_encoder_in_bf16(monkeypatch):
    """Lightning runs training_step under autocast but backward outside it: the replay re-enters the forward's
    autocast state, so its embeddings (and gradients) are those of the bf16 forward; the loss runs in fp32."""
    encoder = _encoder(dtype=torch.float32)
    batch = _batch(encoder)
    bf16 = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    # without autocast's weight cache, every chunk casts the weights itself and their bf16 gradients are summed in
    # fp32, as over the replay's separate chunks (the cache would sum all chunks' gradients in bf16 first)
    reference = _chunked_step(encoder, _loss("gte"), batch, 4, precision=bf16(cache_enabled=False))
    reference_grads = _take_grads(encoder)
    seen: list[torch.dtype] = []
    loss_fn = _loss("gte")
    loss_fn.register_forward_pre_hook(lambda module, args: seen.extend(a.dtype for a in args if a is not None))

    def cached_grads() -> tuple[LossOutput, dict[str, torch.Tensor]]:
        with bf16():
            out = cached_loss(encoder, loss_fn, batch["query"], batch["doc"], NEGATIVES, 4)
        out.loss.backward()  # outside autocast, as in Lightning
        return out, _take_grads(encoder)

    cached, grads = cached_grads()
    assert set(seen) == {torch.float32} and cached.loss.dtype == torch.float32
    assert cached.loss.item() == pytest.approx(reference.loss.item(), abs=1e-6)
    _assert_same_grads(grads, reference_grads, tol=1e-4)
    # the control: replayed in fp32, the chunks' gradients are those of another forward
    monkeypatch.setattr(gradcache.AutocastState, "context", lambda self: contextlib.nullcontext())
    _, fp32_grads = cached_grads()
    assert max((fp32_grads[n] - g).abs().max().item() for n, g in reference_grads.items()) > 1e-3


# --- Lightning: configuration, warning, real fits --------------------------------------------------------------------
def test_config_keeps_automatic_optimisation_clipping_and_accumulation_in_the_trainer(make_cfg):
    cfg = make_cfg(["debug=fast", "logger=none", "callbacks=none", "loss.mini_batch_size=4",
                    "trainer.accumulate_grad_batches=2"])
    module = build_module(cfg, build_encoder(cfg))
    trainer = build_trainer(cfg, [], [])
    assert module.automatic_optimization and module.mini_batch_size == 4
    assert trainer.gradient_clip_val == cfg.trainer.gradient_clip_val == 1.0 and trainer.accumulate_grad_batches == 2


def test_accumulating_batches_warns_once_that_it_adds_no_negatives(caplog):
    module = ContrastiveModule(encoder=torch.nn.Identity(), loss=default_loss("infonce"), optimizer=torch.optim.SGD,
                               lr=0.1)
    module.trainer = SimpleNamespace(accumulate_grad_batches=4)
    with pytest.warns(UserWarning, match=r"in-batch negatives.*loss\.mini_batch_size"):
        module.on_fit_start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.on_fit_start()  # once is enough
        # with the cached loss, accumulation is a deliberate way to a larger optimizer batch: said, not warned
        cached = ContrastiveModule(encoder=torch.nn.Identity(), loss=default_loss("infonce", mini_batch_size=8),
                                   optimizer=torch.optim.SGD, lr=0.1)
        cached.trainer = SimpleNamespace(accumulate_grad_batches=2, is_global_zero=True)
        with caplog.at_level(logging.INFO):
            cached.on_fit_start()
    assert "averages 2 cached contrastive batches" in caplog.text


def test_the_cached_loss_refuses_fsdp():
    module = ContrastiveModule(encoder=torch.nn.Identity(), loss=default_loss("infonce", mini_batch_size=8),
                               optimizer=torch.optim.SGD, lr=0.1)
    module.trainer = SimpleNamespace(accumulate_grad_batches=1, strategy=FSDPStrategy())
    with pytest.raises(ValueError, match="fsdp"):
        module.on_fit_start()


class _Recorder(ContrastiveModule):
    """Keeps each micro-batch's loss, the gradient norm before clipping and the gradients after it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.losses: list[float] = []
        self.norms: list[float] = []
        self.grads: list[dict[str, torch.Tensor]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.losses.append(loss.item())
        return loss

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        self.norms.append(float(torch.nn.utils.get_total_norm([p.grad for p in self.parameters()
                                                                if p.grad is not None])))
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.grads.append({n: p.grad.clone() for n, p in self.encoder.named_parameters() if p.grad is not None})


def _fit(mini_batch_size: int | None, dtype: torch.dtype = torch.float64, **trainer_options: Any) -> _Recorder:
    """One process, plain SGD on ROWS in batches of 3 (two batches, same order every time); float64 by default."""
    from lightning.pytorch import Trainer

    if "plugins" not in trainer_options:
        trainer_options["precision"] = "64-true"
    encoder = _encoder(dtype=dtype)
    module = _Recorder(encoder=encoder, loss=_loss("gte", mini_batch_size=mini_batch_size),
                       optimizer=torch.optim.SGD, lr=0.5)
    loader = DataLoader(ROWS, batch_size=3, collate_fn=PairCollator(encoder.tokenizer, encoder.max_length))
    trainer = Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False,
                      enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
                      limit_val_batches=0, **trainer_options)
    trainer.fit(module, train_dataloaders=loader)
    return module


def _clip_half_the_norm() -> float:
    encoder = _encoder()
    _full_batch_step(encoder, _loss("gte"), _batch(encoder, rows=ROWS[:3]))
    return float(torch.nn.utils.clip_grad_norm_(encoder.parameters(), float("inf"))) / 2


@pytest.mark.parametrize("setting", ["accumulate", "clip"])
def test_lightning_accumulates_and_clips_the_cached_loss_like_the_uncached_one(setting):
    options = ({"accumulate_grad_batches": 2, "max_steps": 1} if setting == "accumulate"
               else {"gradient_clip_val": _clip_half_the_norm(), "max_steps": 2})
    cached, uncached = _fit(2, **options), _fit(None, **options)
    assert len(cached.losses) == 2 and cached.losses == pytest.approx(uncached.losses, abs=1e-10)
    assert len(cached.grads) == options["max_steps"]
    if setting == "clip":  # clipping is active: the norm before it is twice the threshold
        assert cached.norms[0] == pytest.approx(2 * options["gradient_clip_val"], rel=1e-8)
    for grads, reference in zip(cached.grads, uncached.grads, strict=True):
        _assert_same_grads(grads, reference)
    # the same update: parameters after the step(s)
    reference_params = dict(uncached.encoder.named_parameters())
    for name, param in cached.encoder.named_parameters():
        torch.testing.assert_close(param, reference_params[name], atol=1e-10, rtol=1e-10, msg=name)


def test_fp16_grad_scaler_scales_the_replayed_gradients_once():
    """16-mixed (GradScaler): dL/de arrives multiplied by the scale, the replay keeps it, Lightning unscales once
    before clipping; fp16 rounding differs from the uncached step's, so the check is on direction and size."""
    from lightning.pytorch.plugins.precision import MixedPrecision

    def fit(mini_batch_size: int | None) -> _Recorder:
        # Trainer(precision="16-mixed") falls back to bf16 on a CPU: the plugin forces fp16 autocast + GradScaler
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)
        return _fit(mini_batch_size, torch.float32, max_steps=2, plugins=[MixedPrecision("16-mixed", "cpu", scaler)])

    cached, uncached = fit(2), fit(None)
    assert cached.trainer.precision_plugin.scaler.get_scale() == 2.0**12  # no overflow: both steps were taken
    assert cached.losses == pytest.approx(uncached.losses, abs=1e-2)
    for grads, reference in zip(cached.grads, uncached.grads, strict=True):
        flat = torch.cat([grads[name].flatten() for name in reference])
        reference_flat = torch.cat([g.flatten() for g in reference.values()])
        assert torch.nn.functional.cosine_similarity(flat, reference_flat, dim=0) > 0.999
        assert flat.norm() / reference_flat.norm() == pytest.approx(1.0, abs=0.01)


def test_the_issue_command_with_accumulation_trains_through_hydra(make_cfg, tmp_path):
    """`python train.py data.batch_size=1024 loss.mini_batch_size=32 trainer.accumulate_grad_batches=2`, sized
    for the debug data: 4 batches of 16 make 2 optimizer steps."""
    out = tmp_path / "cached"
    cfg = make_cfg(["debug=fast", "logger=none", "data.batch_size=16", "loss.mini_batch_size=4",
                    "trainer.accumulate_grad_batches=2", "precision=bf16-mixed"], output_dir=out)
    value = train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= value <= 1.0 and metrics["global_step"] == 2
    assert {"train/loss", "train/acc", "train/sim_pos", "train/sim_neg"} <= set(metrics["train"])
    assert all(math.isfinite(v) for v in metrics["train"].values())
    # Lightning's own loop stepped the optimizer and the (linear warm-up) scheduler once per 2 batches
    state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["lr_schedulers"][0]["last_epoch"] == 2
    assert {int(s["step"]) for s in state["optimizer_states"][0]["state"].values()} == {2}


# --- DDP: 2 gloo processes through Lightning's automatic loop ---------------------------------------------------------
_SYNCED_BACKWARDS = [0]


def _counting_allreduce(state, bucket):  # no annotations: DDP rejects a string (postponed) GradBucket annotation
    """DDP's default all-reduce, counting backward passes that synchronised (the last bucket ends each one)."""
    if bucket.is_last():
        _SYNCED_BACKWARDS[0] += 1
    return allreduce_hook(state, bucket)


class _EveryOtherRow(torch.utils.data.Sampler):
    """Rank r of 2 takes rows r, r+2, r+4, ... in order (Lightning's own sampler would shuffle the training rows)."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size // 2

    def __iter__(self):
        return iter(range(torch.distributed.get_rank(), self.size, 2))  # read in the spawned process


class _DDPRecorder(ContrastiveModule):
    """Saves what each rank computed in its last step: local loss, gradients after DDP sync and clipping."""

    def __init__(self, *args: Any, out: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out
        self.record: dict[str, Any] = {}

    def on_train_start(self) -> None:
        self.trainer.strategy.model.register_comm_hook(None, _counting_allreduce)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.record["loss"] = loss.detach()
        return loss

    def configure_gradient_clipping(self, optimizer: torch.optim.Optimizer, gradient_clip_val: Any = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        super().configure_gradient_clipping(optimizer, gradient_clip_val, gradient_clip_algorithm)
        self.record["grads"] = {n: p.grad.clone() for n, p in self.encoder.named_parameters() if p.grad is not None}

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        torch.save({**self.record, "synced": _SYNCED_BACKWARDS[0]}, f"{self.out}.{self.global_rank}")


def test_two_ddp_ranks_with_the_cached_loss_equal_one_process_uncached_on_the_whole_batch(tmp_path: Path):
    from lightning.pytorch import Trainer
    from lightning.pytorch.strategies import DDPStrategy

    encoder = _encoder()
    reference_encoder = copy.deepcopy(encoder)
    reference = _full_batch_step(reference_encoder, _loss("gte"), _batch(reference_encoder))
    norm = torch.nn.utils.clip_grad_norm_(reference_encoder.parameters(), float("inf"))
    clip = float(norm) / 2  # clipping must change the gradients, or it is not tested
    torch.nn.utils.clip_grad_norm_(reference_encoder.parameters(), clip)
    reference_grads = _take_grads(reference_encoder)

    out = str(tmp_path / "rank")
    module = _DDPRecorder(encoder=encoder, loss=_loss("gte", gather_across_devices=True, mini_batch_size=2),
                          optimizer=functools.partial(torch.optim.SGD), lr=0.0, out=out)
    # 3 rows per rank and batch (DistributedSampler: rank 0 gets rows 0, 2, 4): 2 query chunks + 5 doc chunks each.
    # Four batches of the same rows (lr=0: same weights), two accumulated per step: the first of each pair must not
    # synchronise (Lightning's no_sync), the mean of two equal gradients is the reference again, and the second
    # step checks that DDP's reducer state carries over
    loader = DataLoader(ROWS * 4, batch_size=3, sampler=_EveryOtherRow(len(ROWS) * 4),
                        collate_fn=PairCollator(encoder.tokenizer, encoder.max_length))
    trainer = Trainer(accelerator="cpu", devices=2, precision="64-true", max_steps=2, logger=False,
                      use_distributed_sampler=False,
                      strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=120)),
                      gradient_clip_val=clip, accumulate_grad_batches=2,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)

    ranks = [torch.load(f"{out}.{rank}") for rank in range(2)]  # the last batch's
    # each rank's loss is the mean over its queries (against all 6): their mean is the whole batch's loss
    # (Lightning divides the returned loss by accumulate_grad_batches before backward, not the one kept here)
    assert (ranks[0]["loss"] + ranks[1]["loss"]).item() / 2 == pytest.approx(reference.loss.item(), abs=1e-5)
    for rank in ranks:
        assert rank["synced"] == 2  # one all-reduce per optimizer step, after all chunks of both micro-batches
        _assert_same_grads(rank["grads"], reference_grads)
