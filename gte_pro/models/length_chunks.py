"""Less padding at the same batch: a forward pass over rows of mixed lengths, run in a few chunks of similar length.

A batch padded to its longest text computes every shorter text's padding as well. Queries are the worst case: a
few long ones set the width for all the others (with length-grouped batches of the demo corpus, 63% of the query
positions were padding). ``model.length_chunks=K`` sorts a forward pass's rows by length and cuts them into at most
K contiguous groups, chosen to minimise the padded positions, each run at its own length. The rows, and therefore
the batch, its in-batch negatives and the loss, are the same as without it; only the padding is not computed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from gte_pro.errors import ConfigError

_NEVER = np.iinfo(np.int64).max // 4  # "no such split": far above any real count, and safe to add to
# model.length_chunks=auto on the CPU (make bench: 1.17x the samples/s of one padded pass; ModernBERT's training
# step 3.2x with sdpa, ahead of 2 chunks' 2.3x: make bench-modernbert, docs/models.md)
AUTO_CPU_CHUNKS = 4


def parse_length_chunks(value: Any) -> int | str:
    """``model.length_chunks``: ``auto`` or a number of chunks >= 1."""
    if value == "auto":
        return "auto"
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"model.length_chunks={value!r} is not valid: auto, 1 (one padded pass) or more chunks "
                         "per pass")
    return value


def chunks_for(setting: int | str, device_type: str) -> int:
    """The most chunks of a pass on a device of ``device_type``. ``auto``: 4 on the CPU, where the padding's
    compute is the cost, else 1: on an H200, MiniLM at batch 32 trained 2.5x slower in 4 chunks, since a small
    pass is bound by the host's kernel launches (each chunk is another pass), not by the positions."""
    if setting == "auto":
        return AUTO_CPU_CHUNKS if device_type == "cpu" else 1
    return int(setting)


def chunk_plan(lengths: Sequence[int] | np.ndarray, max_chunks: int) -> list[tuple[np.ndarray, int]]:
    """(row indices, padded length) of each chunk: at most ``max_chunks`` groups of rows, longest first, whose
    padded positions (rows x the group's longest) add up to the fewest possible (an exact dynamic programme over
    the distinct lengths, so its size is bounded by the maximum length, not by the number of rows)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return []
    order = np.argsort(-lengths, kind="stable")
    distinct, counts = np.unique(-lengths, return_counts=True)  # longest first
    distinct = -distinct
    before = np.concatenate([[0], np.cumsum(counts)])  # sorted rows before each distinct length
    groups = len(distinct)
    # cost[i, j]: the rows of distinct lengths i..j-1 padded to length i, the longest of them
    i, j = np.arange(groups)[:, None], np.arange(groups + 1)[None, :]
    cost = np.where(j > i, (before[j] - before[i]) * distinct[:, None], _NEVER)
    best = np.full(groups + 1, _NEVER)
    best[0] = 0
    starts, used = [], []
    for _ in range(max(1, max_chunks)):
        total = best[:groups, None] + cost  # the best split of lengths before i, then one chunk i..j-1
        start = total.argmin(axis=0)
        with_chunk = total[start, np.arange(groups + 1)]
        better = with_chunk < best
        best = np.where(better, with_chunk, best)
        starts.append(start)
        used.append(better)
    chunks, end = [], groups
    for start, better in zip(reversed(starts), reversed(used), strict=True):
        if end == 0:
            break
        if better[end]:
            first = int(start[end])
            chunks.append((order[before[first] : before[end]], int(distinct[first])))
            end = first
    return chunks[::-1]


def padded_positions(lengths: Sequence[int] | np.ndarray, max_chunks: int, width: int | None = None) -> int:
    """Positions a forward pass computes: with one chunk, every row at ``width`` (the padded tensor's, by default
    the longest); with more, each chunk at its own longest length."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if max_chunks <= 1:
        return len(lengths) * int(width if width is not None else lengths.max(initial=0))
    return sum(len(rows) * length for rows, length in chunk_plan(lengths, max_chunks))


def pass_plan(attention_mask: torch.Tensor, max_chunks: int) -> list[tuple[np.ndarray, int]] | None:
    """The chunks of one forward pass over a right-padded batch, or None for one pass over the padded batch (one
    chunk, or a traced / exported graph, which must not depend on the lengths)."""
    if max_chunks <= 1 or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
        return None
    plan = chunk_plan(attention_mask.sum(dim=1).tolist(), max_chunks)
    return None if len(plan) == 1 and plan[0][1] == attention_mask.shape[1] else plan


def run_in_chunks(forward: Callable[..., torch.Tensor], plan: list[tuple[np.ndarray, int]], input_ids: torch.Tensor,
                  attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
    """``forward`` over each chunk of ``plan``, cut to its own longest text (right padding: the tail is padding),
    with the outputs put back in the batch's row order."""
    parts = []
    for rows, length in plan:
        index = torch.as_tensor(rows, device=input_ids.device)
        parts.append(forward(*(t[index, :length] for t in (input_ids, attention_mask)),
                             **{k: v[index, :length] for k, v in extra.items()}))
    # concatenated chunk rows -> their original positions
    restore = torch.as_tensor(np.argsort(np.concatenate([rows for rows, _ in plan])), device=input_ids.device)
    return torch.cat(parts)[restore]
