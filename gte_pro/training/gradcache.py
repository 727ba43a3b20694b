"""Cached contrastive loss (GradCache: Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup"): a contrastive batch of any size in the activation memory of ``mini_batch_size`` texts.

A contrastive loss couples every query with every document of the batch, so the batch cannot be cut into
independent pieces the way gradient accumulation cuts it. But the encoder embeds each text on its own, so the
parameter gradient factorises through the (small) embeddings e_i:  dL/dθ = Σ_i (dL/de_i)ᵀ · de_i/dθ.

``cached_loss`` returns an ordinary loss whose ``backward()`` does the work, so the caller's training loop (here
Lightning's automatic optimisation: precision plugins and the fp16 GradScaler, gradient accumulation, clipping,
schedulers, DDP) stays in charge, as with sentence-transformers' ``CachedMultipleNegativesRankingLoss``:

1. forward: embed all texts in chunks of M without building graphs (no activations are kept), saving the RNG
   state before each chunk and the autocast state the encoder runs in;
2. the loss is computed on the whole batch of embeddings (B x dim numbers, cheap) in fp32. Its graph ends in one
   autograd node (``_CachedEmbeddings``) that takes the encoder's parameters as inputs;
3. backward: that node receives dL/de for every embedding, already multiplied by whatever the loop scaled the
   loss with (GradScaler, 1/accumulate_grad_batches); under DDP the loss's autograd-aware all_gather has summed
   what every rank's loss sends to this rank's embeddings. Per chunk it restores the RNG state (dropout draws the
   same masks as in 1), embeds the chunk again *with* a graph under the forward's autocast state, and takes the
   parameter gradient of the surrogate <e_chunk, dL/de_chunk>, which is exactly that chunk's share of dL/dθ. Only
   one chunk's graph is alive at a time. The node returns the sum over chunks as its parameters' gradients.

Because the parameter gradients leave through that one node, autograd accumulates them into ``.grad`` once per
backward: DDP's reducer sees each parameter ready once and all-reduces once per step, after all chunks (also with
``find_unused_parameters``: the parameters are reachable from the loss), and its ``no_sync`` for accumulated
micro-batches works as for any loss. Not supported: FSDP, which gathers and frees its sharded parameters around
forward and backward itself (the module refuses the combination).

What "equal" means: the parameter gradients are those of the loss of the forward computation of step 1, up to
floating-point summation order. With dropout off that is the uncached full-batch loss; with dropout on it is the
loss of embedding the same chunks in the same order with gradients (dropout masks depend on the RNG stream and
on the shapes it is drawn for, so no chunked run can reproduce the masks of one full-batch forward).

Cost: every text goes forward twice and backward once (about 4/3 of the compute of an uncached step for a
transformer), plus one host sync per tokenized tensor to cut chunks to their own padding, and during backward
one parameter-sized buffer for the sum over chunks.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from typing import Any

import torch

from gte_pro.errors import ConfigError
from gte_pro.training.losses import GuideEmbeddings, LossOutput, split_documents
from gte_pro.training.losses.partition import at_least_fp32

Features = Mapping[str, torch.Tensor]
Gradients = list[torch.Tensor | None]


@dataclass
class RngState:
    """The random-number state that dropout reads on this device: the CPU generator, plus the accelerator's."""

    cpu: torch.Tensor
    accelerator: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def capture(cls, device: torch.device) -> RngState:
        accelerator = {}
        if device.type not in ("cpu", "meta"):
            # cuda, xpu, mps, ... each keep their own generator: dropout on the device draws from that one
            accelerator[device] = torch.get_device_module(device).get_rng_state(device)
        return cls(torch.get_rng_state(), accelerator)

    def restore(self) -> None:
        torch.set_rng_state(self.cpu)
        for device, state in self.accelerator.items():
            torch.get_device_module(device).set_rng_state(state, device)


@dataclass
class AutocastState:
    """Whether (and in which dtype) autocast is on for a device type.

    Backward runs outside the training loop's autocast context (on CUDA even on another thread, and autocast is
    thread-local): the replay must re-enter the forward's state explicitly to compute the same embeddings.
    """

    device_type: str
    enabled: bool
    dtype: torch.dtype | None

    @classmethod
    def capture(cls, device_type: str) -> AutocastState:
        if not torch.amp.is_autocast_available(device_type):
            return cls(device_type, False, None)
        return cls(device_type, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))

    def context(self) -> AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype, enabled=self.enabled)


def split_features(features: Features, size: int) -> list[dict[str, torch.Tensor]]:
    """Row chunks of ``size`` of a tokenized batch, each cut to its own longest text.

    The collator pads the whole batch to its longest text; a chunk of M short texts would otherwise pay for the
    longest of all B. Only trailing columns that are padding in every row of the chunk are cut, so real tokens
    keep their positions (exact for absolute position embeddings); left-padded batches have no such columns and
    stay as they are.
    """
    mask = features["attention_mask"]
    rows, width = mask.shape
    # last real column + 1 of every row, then of every chunk: one host sync for the whole batch
    ends = (mask.ne(0) * torch.arange(1, width + 1, device=mask.device)).amax(dim=1)
    chunk_ends = torch.stack([part.max() for part in ends.split(size)]).tolist()
    chunks = []
    for start, end in zip(range(0, rows, size), chunk_ends, strict=True):
        end = max(int(end), 1)
        chunks.append({key: value[start : start + size, :end] if value.ndim >= 2 and value.shape[1] == width
                       else value[start : start + size] for key, value in features.items()})
    return chunks


def _loss_precision(device: torch.device) -> AbstractContextManager:
    """Autocast off: the loss runs in fp32 (or the embeddings' wider dtype) whatever precision the encoder uses."""
    if torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _accumulate(total: Gradients | None, grads: Sequence[torch.Tensor | None]) -> Gradients:
    """``total += grads`` in place, parameter by parameter (None: the chunk did not reach that parameter)."""
    if total is None:
        # dense copies only where autograd returned an expanded or strided view that cannot be added into
        return [g if g is None or g.is_contiguous() else g.contiguous() for g in grads]
    for index, grad in enumerate(grads):
        if grad is not None:
            total[index] = grad.contiguous() if total[index] is None else total[index].add_(grad)
    return total


@dataclass
class _Replay:
    """What backward needs to embed each chunk again exactly as the graph-free forward did."""

    encoder: Callable[..., torch.Tensor]
    params: list[torch.Tensor]
    chunks: list[dict[str, torch.Tensor]]
    states: list[RngState]
    autocast: AutocastState
    device: torch.device

    def gradients(self, grad: torch.Tensor) -> Gradients:
        """Σ over chunks of d<e_chunk, grad_chunk>/dθ, for every parameter (None where no chunk reaches it)."""
        # the replay must not move the RNG stream: training continues from where the forward left it
        resume = RngState.capture(self.device)
        sizes = [chunk["input_ids"].shape[0] for chunk in self.chunks]
        total: Gradients | None = None
        for chunk, state, chunk_grad in zip(self.chunks, self.states, grad.split(sizes), strict=True):
            state.restore()
            with torch.enable_grad():  # backward runs with grad mode off
                with self.autocast.context():
                    embedding = self.encoder(**chunk)
                # in the gradient's (fp32+) dtype: fp16 gradients of single embeddings could underflow
                surrogate = torch.sum(embedding.to(chunk_grad.dtype) * chunk_grad)
            # autograd.grad, not backward: nothing lands in .grad (nor fires DDP's hooks) before the sum leaves
            # this node as the parameters' one gradient
            total = _accumulate(total, torch.autograd.grad(surrogate, self.params, allow_unused=True))
        resume.restore()
        return total if total is not None else [None] * len(self.params)


class _CachedEmbeddings(torch.autograd.Function):
    """Identity on graph-free embeddings whose backward replays the encoder: the parameters' one gradient node."""

    @staticmethod
    def forward(ctx: Any, replay: _Replay, embeddings: torch.Tensor, *params: torch.Tensor) -> torch.Tensor:
        ctx.replay = replay
        return embeddings.clone()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return None, None, *ctx.replay.gradients(grad)


def _trainable(encoder: Callable[..., torch.Tensor], params: Iterable[torch.Tensor] | None) -> list[torch.Tensor]:
    if params is None:
        if not isinstance(encoder, torch.nn.Module):
            raise TypeError("pass params= when the encoder is not a torch.nn.Module")
        params = encoder.parameters()
    return [p for p in params if p.requires_grad]


def embed_cached(
    encoder: Callable[..., torch.Tensor],
    batches: Sequence[Features],
    mini_batch_size: int,
    params: Iterable[torch.Tensor] | None = None,
) -> torch.Tensor:
    """The embeddings of all rows of ``batches``, concatenated in order, in fp32 (or wider), embedded in chunks of
    ``mini_batch_size`` rows without graphs; backpropagating through them replays the chunks (module docstring).

    ``params``: the encoder's parameters that receive gradients (default: ``encoder.parameters()``). Call it
    inside the autocast context the encoder should run in; the replay in backward runs in the same one.
    """
    if mini_batch_size < 1:
        raise ConfigError(f"loss.mini_batch_size must be >= 1, got {mini_batch_size}")
    device = batches[0]["input_ids"].device
    chunks = [chunk for features in batches for chunk in split_features(features, mini_batch_size)]
    states: list[RngState] = []
    embeddings: list[torch.Tensor] = []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RngState.capture(device))
            embeddings.append(encoder(**chunk))
    trainable = _trainable(encoder, params)
    replay = _Replay(encoder, trainable, chunks, states, AutocastState.capture(device.type), device)
    return _CachedEmbeddings.apply(replay, at_least_fp32(torch.cat(embeddings)), *trainable)


def cached_loss(
    encoder: Callable[..., torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], LossOutput],
    query_features: Features,
    doc_features: Features,
    num_negatives: int,
    mini_batch_size: int,
    params: Iterable[torch.Tensor] | None = None,
    teacher_scores: torch.Tensor | None = None,
    guide: GuideEmbeddings | None = None,
) -> LossOutput:
    """The contrastive loss of the whole batch, in the activation memory of ``mini_batch_size`` texts.

    ``doc_features`` holds the B positives, then the k hard negatives of each query in order (the collator's
    layout). The loss runs in fp32 with autocast off; ``loss.backward()`` fills the encoder's ``.grad`` with the
    gradients of the whole batch's loss, however the caller scales or accumulates it. ``teacher_scores`` (the batch's,
    for the distillation losses) and ``guide`` (``loss.guide``'s embeddings of the whole batch, computed once without
    gradients: nothing of it is replayed) are passed on to ``loss_fn`` when given.
    """
    reps = embed_cached(encoder, [query_features, doc_features], mini_batch_size, params)
    batch_size = query_features["input_ids"].shape[0]
    with _loss_precision(reps.device):
        positives, negatives = split_documents(reps[batch_size:], batch_size, num_negatives)
        extra = {} if teacher_scores is None else {"teacher_scores": teacher_scores}
        extra |= {} if guide is None else {"guide": guide}
        return loss_fn(reps[:batch_size], positives, negatives, **extra)


def cached_step(
    encoder: Callable[..., torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], LossOutput],
    query_features: Features,
    doc_features: Features,
    num_negatives: int,
    mini_batch_size: int,
    params: Iterable[torch.Tensor] | None = None,
) -> LossOutput:
    """``cached_loss`` and its backward, for plain loops (benchmarks): gradients in ``.grad``, the loss detached."""
    out = cached_loss(encoder, loss_fn, query_features, doc_features, num_negatives, mini_batch_size, params)
    out.loss.backward()
    return replace(out, loss=out.loss.detach())
