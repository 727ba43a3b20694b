"""Texts -> embeddings for mining, the work shared over the ranks of a distributed run.

All texts are sorted by token count (longest first; then by characters, then input order) and cut into batches; rank r
embeds batches r, r + W, r + 2W, ... So every text is embedded in the same batch, with the same padding, however
many processes share the work: its embedding is bit for bit what one process computes (a different batch would
change the float rounding), which is what lets ``strategy=ddp`` mine exactly what one process mines. Sorting cuts
the padding as in evaluation (``gte_pro.data.datasets.EvalTexts``).

Nothing here knows about Lightning: a training run passes its precision context as ``autocast``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from gte_pro.data.collate import EvalCollator
from gte_pro.data.datasets import TokenizedTexts, longest_first
from gte_pro.mining.core import MinedNegatives, mine_negatives
from gte_pro.mining.options import MiningOptions
from gte_pro.mining.problem import MiningCorpus
from gte_pro.models.encoder import Encoder
from gte_pro.retrieval import all_gather_rows
from gte_pro.utils.distributed import world
from gte_pro.utils.progress import Progress

log = logging.getLogger(__name__)

def shard_batches(lengths: np.ndarray, chars: np.ndarray, batch_size: int, rank: int,
                  world_size: int) -> list[np.ndarray]:
    """This rank's batches (text indices): all texts longest first (tokens, then characters), cut into batches,
    dealt round-robin. Arrays, not lists of Python ints: a 10M-document corpus would spend 36 bytes on each."""
    order = longest_first(lengths, chars)
    return [order[start : start + batch_size].copy()
            for start in range(rank * batch_size, len(order), world_size * batch_size)]


def embed_texts(encoder: Encoder, texts: Sequence[str], batch_size: int, max_length: int,
                autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
                what: str = "texts") -> tuple[torch.Tensor, torch.Tensor]:
    """``embed_tokens`` of ``texts`` tokenized now (truncated at ``max_length``; prefixes are the caller's to
    add)."""
    return embed_tokens(encoder, TokenizedTexts(encoder.tokenizer, texts, max_length), batch_size, autocast, what)


def embed_tokens(encoder: Encoder, tokens: Any, batch_size: int,
                 autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
                 what: str = "texts") -> tuple[torch.Tensor, torch.Tensor]:
    """(embeddings (n_local, d) float32 on the encoder's device, global indices (n_local,)) of this rank's share of
    ``tokens`` (``lengths``, ``chars`` and the token ids of each text by index, e.g. ``TokenizedTexts``), the ranks
    being those of ``gte_pro.utils.distributed.world()`` (one without a process group). ``encoder``:
    a ``gte_pro.models.encoder.Encoder``. Inference mode, eval mode during the call (the previous mode is restored),
    each batch under ``autocast()``."""
    if batch_size < 1:
        raise ValueError(f"embed_texts: batch_size={batch_size} must be at least 1")
    collate = EvalCollator(encoder.tokenizer)
    rank, world_size = world()
    batches = shard_batches(tokens.lengths, tokens.chars, batch_size, rank, world_size)
    device = next(encoder.parameters()).device
    share = f" (rank 0's share of {world_size} ranks)" if world_size > 1 else ""
    count = sum(map(len, batches))
    progress = Progress(f"embedding {what}", count, quiet=rank != 0, note=share)
    # one buffer, filled batch by batch: a list of parts joined at the end would hold the shard twice. Made
    # outside inference mode, so that the search may scale it in place
    out = torch.empty(count, encoder.dim, device=device)
    done, was_training = 0, encoder.training
    encoder.eval()
    try:
        with torch.inference_mode():
            for batch in batches:
                features = collate([(i, tokens[i]) for i in batch.tolist()])["features"]
                with autocast():
                    embeddings = encoder(**{k: v.to(device) for k, v in features.items()})
                out[done : done + len(batch)] = embeddings.float()
                done += len(batch)
                progress.update(done)
    finally:
        encoder.train(was_training)
    progress.finish()
    index = torch.from_numpy(np.concatenate(batches) if batches else np.empty(0, dtype=np.int64)).to(device)
    return out, index


def gather_embeddings(embeddings: torch.Tensor, index: torch.Tensor, total: int) -> torch.Tensor:
    """Every rank's (embeddings, global indices) -> the (total, d) matrix in text order, on every rank (collective;
    for the queries, which every rank needs whole). Raises if some text was embedded by no rank."""
    rows, _ = all_gather_rows(embeddings)
    ids, _ = all_gather_rows(index)
    out = embeddings.new_zeros((total, embeddings.shape[-1]))
    seen = torch.zeros(total, dtype=torch.bool, device=embeddings.device)
    out[ids], seen[ids] = rows, True
    if not bool(seen.all()):
        raise RuntimeError(f"embedded {int(seen.sum())} of {total} texts: a rank's share is missing")
    return out


def corpus_tokens(corpus: Sequence[str], encoder: Encoder, max_length: int) -> Any:
    """The corpus's token ids with the encoder's doc prefix: a ``MiningCorpus`` gives them (its store's are read
    from disk), plain texts are tokenized now."""
    prefix = getattr(encoder, "doc_prefix", "")
    if isinstance(corpus, MiningCorpus):
        return corpus.tokens(encoder.tokenizer, max_length, prefix)
    return TokenizedTexts(encoder.tokenizer, [prefix + d for d in corpus], max_length)


def mine_texts(encoder: Encoder, queries: Sequence[str], corpus: Sequence[str], positives: Sequence[Sequence[int]],
               options: MiningOptions, batch_size: int, max_length: int,
               autocast: Callable[[], AbstractContextManager] = contextlib.nullcontext,
               timings: dict[str, float] | None = None) -> MinedNegatives:
    """Embed the queries (with the encoder's query prefix; gathered to every rank) and the corpus (doc prefix; kept
    sharded), then ``mine_negatives``. Collective under torch.distributed; every rank gets the same result.
    ``timings``, if given, receives the seconds of each phase."""
    timings = {} if timings is None else timings
    start = time.perf_counter()
    prefix = getattr(encoder, "query_prefix", "")
    local, index = embed_texts(encoder, [prefix + q for q in queries], batch_size, max_length, autocast, "queries")
    query_emb = gather_embeddings(local, index, len(queries))
    corpus_emb, corpus_index = embed_tokens(encoder, corpus_tokens(corpus, encoder, max_length), batch_size, autocast,
                                            "corpus")
    timings["embed_s"] = time.perf_counter() - start
    # the shard is ours: scaled to unit rows in place, not copied (the largest array of the run)
    mined = mine_negatives(query_emb, corpus_emb, corpus_index, len(corpus), positives, options, overwrite_corpus=True)
    timings["search_s"] = time.perf_counter() - start - timings["embed_s"]
    return mined
