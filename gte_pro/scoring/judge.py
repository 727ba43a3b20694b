"""Judging a scorer (a teacher, or the student that mined the rows) on the rows' own labels, before it teaches.

A *group* is one query's candidates as distillation sees them: its labelled positive first, then its negatives
(one group per positive of a row with several). From a scorer's scores of the groups (a (G, n) array, positive in
column 0, NaN where a row has fewer candidates):

- ``top1``: the share of groups whose positive scores above every negative (strictly: a tie is not a win);
- ``mean_margin``: the mean of positive minus best negative (on the scorer's own scale: a cross-encoder's logits and
  an embedder's cosines are not comparable, so teacher and student are compared by ``top1``);
- ``mean_entropy``: the mean entropy (nats) of softmax(scores / temperature) over each group's candidates, and
  ``mean_normalised_entropy``, the same divided by log(candidates): 0 is one-hot (the label alone), 1 is uniform
  (nothing to learn: a student fitted to it learns not to separate its positives from its negatives).

``recommended_temperature`` is the temperature at which the mean normalised entropy is ``TARGET_ENTROPY`` (0.5):
halfway between the label alone and no signal, so that the positive leads while the order of the negatives still
weighs; found by bisection on log(temperature) (the entropy of a softmax grows with its temperature).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

TARGET_ENTROPY = 0.5  # the recommended temperature's mean normalised entropy (module doc)
NEAR_UNIFORM = 0.9  # a mean normalised entropy above this is a near-uniform teacher: distillation refuses it
CHUNK = 65536  # groups per block: bounded memory for a mining window of millions of queries
MOST_GROUPS = 200_000  # the recommendation and the entropy curve read at most this many groups (evenly spaced)
# temperatures at which the sidecar records the mean normalised entropy (4 per decade, 1e-3 .. 1e2), so that a
# training run can judge an explicit loss.teacher_temperature without reading the file's scores again
CURVE = tuple(round(10 ** (e / 4), 6) for e in range(-12, 9))


def groups_from_rows(rows: Iterable[tuple[Sequence[float], Sequence[float]]]) -> np.ndarray:
    """(G, 1 + most negatives) float64 groups from rows' (pos_scores, neg_scores): one group per positive, its
    row's negatives after it, NaN-padded; rows without a negative give none (nothing to rank)."""
    groups = [[float(p), *map(float, negs)] for pos, negs in rows if len(negs) for p in pos]
    width = max(map(len, groups), default=2)
    out = np.full((len(groups), width), math.nan)
    for i, group in enumerate(groups):
        out[i, : len(group)] = group
    return out


def groups_from_window(positive: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Groups from a mining window: ``positive`` (Q,) each query's positive score (NaN: none), ``candidates``
    (Q, W) its window's scores (NaN: no candidate); queries without a positive or a candidate are left out.
    float32, as the scores are: a window of millions of queries is large."""
    groups = np.concatenate([np.asarray(positive, dtype=np.float32)[:, None],
                             np.asarray(candidates, dtype=np.float32)], axis=1)
    keep = np.isfinite(groups[:, 0]) & np.isfinite(groups[:, 1:]).any(axis=1)
    return groups[keep]


def _chunks(groups: np.ndarray) -> Iterable[np.ndarray]:
    """float64 blocks of ``CHUNK`` groups (a window's groups are kept in float32)."""
    for start in range(0, len(groups), CHUNK):
        yield groups[start : start + CHUNK].astype(np.float64)


def _normalised_entropy(block: np.ndarray, temperature: float) -> tuple[np.ndarray, np.ndarray]:
    """(entropy in nats, entropy / log(candidates)) of each group's softmax(scores / temperature)."""
    finite = np.isfinite(block)
    logits = np.where(finite, block / temperature, -np.inf)
    logits = logits - logits.max(axis=1, keepdims=True)
    weights = np.where(finite, np.exp(logits), 0.0)
    probs = weights / weights.sum(axis=1, keepdims=True)
    entropy = -np.where(probs > 0, probs * np.log(np.where(probs > 0, probs, 1.0)), 0.0).sum(axis=1)
    return entropy, entropy / np.log(finite.sum(axis=1))


def judge(groups: np.ndarray, temperature: float) -> dict[str, Any]:
    """The scorer's figures on ``groups`` (module doc) at ``temperature``; None figures for no group."""
    count = len(groups)
    if not count:
        return {"groups": 0, "top1": None, "mean_margin": None, "mean_entropy": None,
                "mean_normalised_entropy": None, "temperature": temperature}
    wins = margins = entropies = normalised = 0.0
    for block in _chunks(groups):
        best_negative = np.nanmax(block[:, 1:], axis=1)
        wins += float((block[:, 0] > best_negative).sum())
        margins += float((block[:, 0] - best_negative).sum())
        entropy, share = _normalised_entropy(block, temperature)
        entropies += float(entropy.sum())
        normalised += float(share.sum())
    return {"groups": count, "top1": round(wins / count, 4), "mean_margin": round(margins / count, 4),
            "mean_entropy": round(entropies / count, 4), "mean_normalised_entropy": round(normalised / count, 4),
            "temperature": temperature}


def _sample(groups: np.ndarray) -> np.ndarray:
    """At most ``MOST_GROUPS`` groups, evenly spaced (the same for the same groups)."""
    if len(groups) <= MOST_GROUPS:
        return groups
    return groups[np.linspace(0, len(groups) - 1, MOST_GROUPS).astype(np.int64)]


def mean_normalised_entropy(groups: np.ndarray, temperature: float) -> float:
    sample = _sample(groups)
    return float(np.mean(np.concatenate([_normalised_entropy(block, temperature)[1] for block in _chunks(sample)])))


def recommended_temperature(groups: np.ndarray, target: float = TARGET_ENTROPY) -> float | None:
    """The temperature at which the mean normalised entropy of ``groups`` is ``target`` (3 significant digits;
    bisection on log temperature in [1e-4, 1e4]); None when no temperature reaches it (no group, or every group's
    candidates tied: uniform at any temperature)."""
    if not len(groups):
        return None
    low, high = math.log(1e-4), math.log(1e4)
    if not mean_normalised_entropy(groups, math.exp(low)) <= target <= mean_normalised_entropy(groups, math.exp(high)):
        return None
    for _ in range(40):
        middle = (low + high) / 2
        if mean_normalised_entropy(groups, math.exp(middle)) < target:
            low = middle
        else:
            high = middle
    return float(f"{math.exp((low + high) / 2):.3g}")


def entropy_curve(groups: np.ndarray) -> dict[str, float]:
    """The mean normalised entropy at each temperature of ``CURVE`` (keys: the temperatures as text, for JSON)."""
    if not len(groups):
        return {}
    return {str(t): round(mean_normalised_entropy(groups, t), 4) for t in CURVE}


def entropy_at(curve: dict[str, float], temperature: float) -> float | None:
    """The mean normalised entropy at ``temperature`` read off a recorded ``entropy_curve``: linear in
    log(temperature) between its points, its end values outside them; None for an empty curve."""
    if not curve:
        return None
    points = sorted((math.log(float(t)), value) for t, value in curve.items())
    xs, ys = zip(*points, strict=True)
    return round(float(np.interp(math.log(temperature), xs, ys)), 4)
