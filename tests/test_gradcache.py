"""GradCache (``loss.mini_batch_size``): the cached loss and every parameter gradient equal the uncached ones.

"Equal" is in float64 to 1e-5 (in practice ~1e-14: only the summation order differs). With dropout off the
reference is one uncached forward over the whole batch. With dropout on, masks depend on the RNG stream and on
the shapes they are drawn for, so the reference embeds the same chunks in the same order with gradients (what the
cached step's first pass computes without them); the cached step must reproduce it by restoring the RNG state.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import warnings
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.utils.data import DataLoader

from gte_pro import gradcache, packaged_minilm_path
from gte_pro.data.collate import PairCollator
from gte_pro.gradcache import cached_step, split_features
from gte_pro.losses import GTELoss, InfoNCELoss, LossOutput
from gte_pro.model import Encoder
from gte_pro.module import ContrastiveModule
from gte_pro.builders import build_encoder, build_module, build_trainer
from gte_pro.train import train

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
    return Encoder(packaged_minilm_path(), random_init_config=config, max_length=32).to(dtype)


def _batch(encoder: Encoder, negatives: int = NEGATIVES, rows: list = ROWS) -> dict[str, Any]:
    """The training batch exactly as the datamodule's collator builds it."""
    return PairCollator(encoder.tokenizer, encoder.max_length)([(q, p, n[:negatives]) for q, p, n in rows])


def _loss(name: str, **kwargs: Any):
    return {"infonce": InfoNCELoss, "gte": GTELoss}[name](temperature=0.05, **kwargs)


def _full_batch_step(encoder: Encoder, loss_fn, batch: dict[str, Any]) -> LossOutput:
    """The uncached training step (ContrastiveModule.training_step): one forward over all queries and docs."""
    query, docs = encoder(**batch["query"]), encoder(**batch["doc"])
    size, k = query.shape[0], batch["num_negatives"]
    out = loss_fn(query, docs[:size], docs[size:].reshape(size, k, -1) if k else None)
    out.loss.backward()
    return out


def _chunked_step(encoder: Encoder, loss_fn, batch: dict[str, Any], mini_batch_size: int) -> LossOutput:
    """Uncached, but embedding the cached step's chunks in its order: same RNG draws for the same shapes."""
    query = torch.cat([encoder(**c) for c in split_features(batch["query"], mini_batch_size)])
    docs = torch.cat([encoder(**c) for c in split_features(batch["doc"], mini_batch_size)])
    size, k = query.shape[0], batch["num_negatives"]
    out = loss_fn(query, docs[:size], docs[size:].reshape(size, k, -1) if k else None)
    out.loss.backward()
    return out


def _take_grads(encoder: torch.nn.Module) -> dict[str, torch.Tensor]:
    grads = {name: p.grad.clone() for name, p in encoder.named_parameters() if p.grad is not None}
    encoder.zero_grad(set_to_none=True)
    return grads


def _assert_same(cached: LossOutput, cached_grads: dict, reference: LossOutput, reference_grads: dict) -> None:
    assert cached.loss.item() == pytest.approx(reference.loss.item(), abs=1e-5, rel=1e-5)
    torch.testing.assert_close(cached.scores, reference.scores.detach(), atol=1e-5, rtol=1e-5)
    assert cached_grads.keys() == reference_grads.keys() and len(cached_grads) > 10
    for name, grad in reference_grads.items():
        assert grad.abs().max() > 0, name  # a parameter the loss does not reach would make the check vacuous
        torch.testing.assert_close(cached_grads[name], grad, atol=1e-5, rtol=1e-5, msg=name)


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

    cached = cached_step(counting_encoder, _loss(name), batch["query"], batch["doc"], num_negatives, mini_batch_size)
    _assert_same(cached, _take_grads(encoder), reference, reference_grads)
    # the memory claim, structurally: no encoder call sees more than M texts, and each chunk runs twice
    texts = len(ROWS) * (2 + num_negatives)
    assert max(calls) <= mini_batch_size and sum(calls) == 2 * texts
    assert not cached.loss.requires_grad


@pytest.mark.parametrize("name", ["infonce", "gte"])
def test_with_dropout_restoring_the_rng_replays_the_same_masks(name, monkeypatch):
    encoder = _encoder(dropout=0.1)
    batch = _batch(encoder)
    torch.manual_seed(123)
    reference = _chunked_step(encoder, _loss(name), batch, 4)
    reference_grads = _take_grads(encoder)
    torch.manual_seed(123)
    cached = cached_step(encoder, _loss(name), batch["query"], batch["doc"], NEGATIVES, 4)
    _assert_same(cached, _take_grads(encoder), reference, reference_grads)

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


def test_under_bf16_autocast_the_loss_runs_in_fp32_and_gradients_stay_close():
    """Mixed precision: the encoder runs under the active autocast, the loss (and its gradients) in fp32."""
    encoder = _encoder(dtype=torch.float32)
    batch = _batch(encoder)
    reference = _full_batch_step(encoder, _loss("gte"), batch)
    reference_grads = _take_grads(encoder)
    seen: list[torch.dtype] = []
    # the loss sees fp32 embeddings even though the encoder's matmuls ran in bf16
    loss_fn = _loss("gte")
    loss_fn.register_forward_pre_hook(lambda module, args: seen.extend(a.dtype for a in args if a is not None))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cached = cached_step(encoder, loss_fn, batch["query"], batch["doc"], NEGATIVES, 4)
    grads = _take_grads(encoder)
    assert set(seen) == {torch.float32} and cached.loss.dtype == torch.float32
    assert cached.loss.item() == pytest.approx(reference.loss.item(), abs=0.01)
    flat = torch.cat([grads[n].flatten() for n in reference_grads])
    reference_flat = torch.cat([g.flatten() for g in reference_grads.values()])
    assert torch.isfinite(flat).all()
    assert torch.nn.functional.cosine_similarity(flat, reference_flat, dim=0) > 0.99


def test_mini_batch_size_must_be_positive():
    with pytest.raises(ValueError, match="mini_batch_size"):
        InfoNCELoss(mini_batch_size=0)


# --- Lightning: configuration, warning, a real fit --------------------------------------------------------------------
def test_config_switches_to_manual_optimisation_and_moves_clipping_into_the_module(make_cfg):
    cfg = make_cfg(["debug=fast", "logger=none", "callbacks=none", "loss.mini_batch_size=4"])
    encoder = build_encoder(cfg)
    module = build_module(cfg, encoder)
    trainer = build_trainer(cfg, [], [])
    assert not module.automatic_optimization and module.loss.mini_batch_size == 4
    # Lightning refuses Trainer(gradient_clip_val) under manual optimisation: the module clips with the value
    assert trainer.gradient_clip_val is None and module.gradient_clip_val == cfg.trainer.gradient_clip_val == 1.0
    with pytest.raises(ValueError, match="accumulate_grad_batches"):
        build_trainer(make_cfg(["debug=fast", "loss.mini_batch_size=4", "trainer.accumulate_grad_batches=2"]), [], [])
    assert build_module(make_cfg(["debug=fast"]), encoder).automatic_optimization  # null: the uncached step


def test_accumulating_batches_warns_once_that_it_adds_no_negatives():
    module = ContrastiveModule(encoder=torch.nn.Identity(), loss=InfoNCELoss(), optimizer=torch.optim.SGD, lr=0.1)
    module.trainer = SimpleNamespace(accumulate_grad_batches=4)
    with pytest.warns(UserWarning, match=r"in-batch negatives.*loss\.mini_batch_size"):
        module.on_fit_start()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.on_fit_start()  # once is enough
        cached = ContrastiveModule(encoder=torch.nn.Identity(), loss=InfoNCELoss(mini_batch_size=8),
                                   optimizer=torch.optim.SGD, lr=0.1)
        cached.trainer = SimpleNamespace(accumulate_grad_batches=1)
        cached.on_fit_start()


def test_debug_fit_with_the_cached_loss_trains_and_writes_metrics(make_cfg, tmp_path):
    out = tmp_path / "cached"
    cfg = make_cfg(["debug=fast", "logger=none", "loss.mini_batch_size=4", "data.batch_size=8",
                    "precision=bf16-mixed"], output_dir=out)
    value = train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0.0 <= value <= 1.0 and metrics["global_step"] == 4
    assert {"train/loss", "train/acc", "train/sim_pos", "train/sim_neg"} <= set(metrics["train"])
    assert all(math.isfinite(v) for v in metrics["train"].values())
    # manual optimisation steps the optimizer and the (linear warm-up) scheduler itself: 4 steps each
    state = torch.load(out / "checkpoints" / "last.ckpt", weights_only=False)
    assert state["lr_schedulers"][0]["last_epoch"] == 4
    assert {int(s["step"]) for s in state["optimizer_states"][0]["state"].values()} == {4}


# --- DDP: 2 gloo processes through Lightning's real manual-optimisation path -----------------------------------------
_SYNCED_BACKWARDS = [0]


def _counting_allreduce(state, bucket):  # no annotations: DDP rejects a string (postponed) GradBucket annotation
    """DDP's default all-reduce, counting backward passes that synchronised (the last bucket ends each one)."""
    if bucket.is_last():
        _SYNCED_BACKWARDS[0] += 1
    return allreduce_hook(state, bucket)


class _Recorder(ContrastiveModule):
    """Saves what each rank computed in its one step: local loss, gradients after DDP sync and clipping."""

    def __init__(self, *args: Any, out: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.out = out
        self.record: dict[str, Any] = {}

    def on_train_start(self) -> None:
        self.trainer.strategy.model.register_comm_hook(None, _counting_allreduce)

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        super().on_before_optimizer_step(optimizer)  # clips
        self.record["grads"] = {n: p.grad.clone() for n, p in self.encoder.named_parameters() if p.grad is not None}

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        torch.save({**self.record, "loss": loss, "synced": _SYNCED_BACKWARDS[0]}, f"{self.out}.{self.global_rank}")
        return loss


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
    module = _Recorder(encoder=encoder, loss=_loss("gte", gather_across_devices=True, mini_batch_size=2),
                       optimizer=functools.partial(torch.optim.SGD), lr=0.0, gradient_clip_val=clip, out=out)
    # 3 rows per rank and step (DistributedSampler: rank 0 gets rows 0, 2, 4): 2 query chunks + 5 doc chunks each.
    # Two steps on the same rows (lr=0: same weights): the second checks that DDP's reducer state carries over
    loader = DataLoader(ROWS + ROWS, batch_size=3, collate_fn=PairCollator(encoder.tokenizer, encoder.max_length))
    trainer = Trainer(accelerator="cpu", devices=2, precision="64-true", max_steps=2, logger=False,
                      strategy=DDPStrategy(start_method="spawn", timeout=timedelta(seconds=120)),
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      num_sanity_val_steps=0, limit_val_batches=0)
    trainer.fit(module, train_dataloaders=loader)

    ranks = [torch.load(f"{out}.{rank}") for rank in range(2)]  # the second step's
    # each rank's loss is the mean over its queries (against all 6): their mean is the whole batch's loss
    assert (ranks[0]["loss"] + ranks[1]["loss"]).item() / 2 == pytest.approx(reference.loss.item(), abs=1e-5)
    for rank in ranks:
        assert rank["synced"] == 2  # one all-reduce per step: the 6 chunk backwards before each last did not sync
        assert rank["grads"].keys() == reference_grads.keys() and len(reference_grads) > 10
        for name, grad in reference_grads.items():
            torch.testing.assert_close(rank["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=name)
