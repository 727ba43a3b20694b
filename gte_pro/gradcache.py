"""Cached contrastive loss (GradCache: Gao et al., 2021, "Scaling Deep Contrastive Learning Batch Size under
Memory Limited Setup"): a contrastive batch of any size in the activation memory of ``mini_batch_size`` texts.

A contrastive loss couples every query with every document of the batch, so the batch cannot be cut into
independent pieces the way gradient accumulation cuts it. But the encoder embeds each text on its own, so the
parameter gradient factorises through the (small) embeddings e_i:  dL/dθ = Σ_i (dL/de_i)ᵀ · de_i/dθ.  One step:

1. embed all texts in chunks of M without building graphs (no activations are kept), saving the RNG state
   before each chunk;
2. compute the loss on the full batch of embeddings (detached leaves: B x dim numbers, cheap) and its gradient
   dL/de for every embedding. Under DDP the loss gathers the leaves with the autograd-aware all_gather, so
   dL/de already holds what every rank's loss sends to this rank's embeddings;
3. per chunk: restore its RNG state (dropout draws the same masks as in 1), embed it again *with* a graph and
   backpropagate the surrogate <e_chunk, dL/de_chunk>, whose parameter gradient is exactly that chunk's share of
   dL/dθ. Gradients accumulate in ``.grad``; only one chunk's graph is alive at a time.

What "equal" means: the parameter gradients are those of the loss of the forward computation of step 1, up to
floating-point summation order. With dropout off that is the uncached full-batch loss; with dropout on it is the
loss of embedding the same chunks in the same order with gradients (dropout masks depend on the RNG stream and
on the shapes it is drawn for, so no chunked run can reproduce the masks of one full-batch forward).

Cost: every text goes forward twice and backward once (about 4/3 of the compute of an uncached step for a
transformer), plus one host sync per tokenized tensor to cut chunks to their own padding.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch

from gte_pro.losses import LossOutput, _at_least_fp32

Features = Mapping[str, torch.Tensor]


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


def cached_step(
    encoder: Callable[..., torch.Tensor],
    loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], LossOutput],
    query_features: Features,
    doc_features: Features,
    num_negatives: int,
    mini_batch_size: int,
    backward_fn: Callable[[torch.Tensor], None] | None = None,
    no_sync: Callable[[], AbstractContextManager] | None = None,
) -> LossOutput:
    """One GradCache step: parameter gradients accumulated into ``.grad``; the full-batch loss output returned.

    ``doc_features`` holds the B positives, then the k hard negatives of each query in order (the collator's
    layout). ``backward_fn`` runs each chunk's backward (Lightning's ``manual_backward``, which scales fp16
    losses and prepares DDP's reducer); ``no_sync`` blocks DDP's gradient all-reduce for every chunk but the last,
    so gradients are synchronised once per step, already summed over the chunks. Call it inside the autocast
    context the encoder should run in; the loss itself runs in fp32.
    """
    if mini_batch_size < 1:
        raise ValueError(f"loss.mini_batch_size must be >= 1, got {mini_batch_size}")
    backward_fn = backward_fn or torch.Tensor.backward
    no_sync = no_sync or contextlib.nullcontext
    device = query_features["input_ids"].device
    query_chunks = split_features(query_features, mini_batch_size)
    chunks = query_chunks + split_features(doc_features, mini_batch_size)

    # 1. embeddings without graphs; the RNG state before each chunk, to replay its dropout masks in step 3
    states: list[RngState] = []
    embeddings: list[torch.Tensor] = []
    with torch.no_grad():
        for chunk in chunks:
            states.append(RngState.capture(device))
            embeddings.append(encoder(**chunk))
    # 2. the loss over the whole batch, on leaves: the only graph here is the loss's own (B x candidates)
    query = _at_least_fp32(torch.cat(embeddings[: len(query_chunks)])).requires_grad_()
    docs = _at_least_fp32(torch.cat(embeddings[len(query_chunks) :])).requires_grad_()
    del embeddings
    batch_size = query.shape[0]
    with torch.enable_grad(), _loss_precision(device):
        negatives = docs[batch_size:].reshape(batch_size, num_negatives, -1) if num_negatives else None
        out = loss_fn(query, docs[:batch_size], negatives)
        query_grad, docs_grad = torch.autograd.grad(out.loss, [query, docs])
    sizes = [chunk["input_ids"].shape[0] for chunk in chunks]
    grads = [*query_grad.split(sizes[: len(query_chunks)]), *docs_grad.split(sizes[len(query_chunks) :])]

    # 3. replay each chunk with a graph; its surrogate's gradient w.r.t. the parameters is its share of dL/dθ
    last = len(chunks) - 1
    with torch.enable_grad():
        for index, (chunk, state, grad) in enumerate(zip(chunks, states, grads, strict=True)):
            # the RNG ends where step 1 left it (the last chunk's forward consumes the same draws again), so the
            # rest of training sees the same random stream as after one uncached forward
            state.restore()
            with no_sync() if index < last else contextlib.nullcontext():
                embedding = encoder(**chunk)
                # in the gradient's (fp32+) dtype: fp16 gradients of single embeddings could underflow
                backward_fn(torch.sum(embedding.to(grad.dtype) * grad))
    return LossOutput(out.loss.detach(), out.scores, out.labels)
