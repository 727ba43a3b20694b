"""Telemetry while training: figures of the embedding space read off what the loss already computed (no extra
forward pass), logged every ``eval.telemetry_every_n_steps`` steps as ``telemetry/*`` and drawn in ``curves.png``.

- ``false_negative_rate``: the share of a row's in-batch candidates (every other row's positive and all hard
  negatives of the batch, gathered across ranks when the loss gathers) that the student scores *above* the row's own
  positive, averaged over candidates:  FNR = (1 / (B (C - 1))) Σ_i Σ_{j ≠ p(i)} [s(q_i, d_j) > s(q_i, d_p(i))].
  Early in training it is high (random scores); it should fall. One that stays up or rises while mined negatives
  are in the batch hints at false negatives in the data: negatives that are in fact relevant.
- ``masked_share`` (with ``loss.false_negative_margin``): the share of the loss's negative candidates that the step
  left out of the softmax as false negatives (``gte_pro.training.losses.partition``), as the loss saw them on this rank;
  ``guide_masked_share`` (with ``loss.guide``): the same for the guide's mask, a key of its own, so that with both
  options on each share says what its own rule left out (a candidate both rules mask counts in both).
- ``alignment`` (Wang & Isola, 2020, "Understanding Contrastive Representation Learning through Alignment and
  Uniformity on the Hypersphere", eq. for L_align with alpha = 2):  A = E_(x,y)~pos ||f(x) - f(y)||^2 over the
  batch's (query, positive) pairs, on unit vectors (0: every pair identical; 4: every pair opposite). Lower is better.
- ``uniformity`` (ibid., L_uniform with t = 2):  U = log E_(x,y) exp(-2 ||f(x) - f(y)||^2) over distinct pairs of
  unit vectors, the mean of the query side and the positive side as in the paper's training loss. 0 when every
  embedding collapses onto one point, more negative the more evenly they spread (the lower bound on the sphere
  depends on the dimension). Rising towards 0 warns of collapse.
- ``teacher_agreement``: for rows with teacher scores (distillation data: pos_scores / neg_scores), the share of rows
  whose student's top candidate among [positive, hard negatives] is the teacher's top; ``teacher_spearman``: the
  Spearman rank correlation of student and teacher scores over those candidates, per row, averaged. Slots without
  a teacher score (NaN) are left out; a row needs two scored candidates (and, for Spearman, scores that are not all
  tied) to count.

All functions take detached tensors and run under ``torch.no_grad``; each is one or two small matrix operations on
the step's embeddings or scores. Under DDP each rank computes from what it holds (its own rows against the gathered
candidates) and the module hands the figures to the loggers, which write rank 0's; no collective is added that ranks
could disagree about.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.no_grad()
def false_negative_rate(scores: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Share of the non-positive candidates scored strictly above each row's positive; ``scores`` (B, C) as the loss
    scored them, ``labels`` (B,) the column of each row's positive."""
    scores = scores.float()
    positive = scores.gather(1, labels[:, None])
    above = (scores > positive).sum()  # the positive itself is never strictly above itself
    return above.float() / max(scores.numel() - scores.shape[0], 1)


@torch.no_grad()
def alignment(query: torch.Tensor, positive: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    """Wang & Isola's alignment: mean ``||q - p||^alpha`` over (query, positive) pairs of unit vectors."""
    query, positive = F.normalize(query.float(), dim=-1), F.normalize(positive.float(), dim=-1)
    return (query - positive).norm(dim=-1).pow(alpha).mean()


@torch.no_grad()
def uniformity(embeddings: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """Wang & Isola's uniformity of one set: ``log mean exp(-t ||x - y||^2)`` over its distinct pairs of unit vectors;
    NaN with fewer than two embeddings (no pair)."""
    unit = F.normalize(embeddings.float(), dim=-1)
    if unit.shape[0] < 2:
        return torch.tensor(float("nan"), device=unit.device)
    return torch.pdist(unit, p=2).pow(2).mul(-t).exp().mean().log()


@torch.no_grad()
def pair_uniformity(query: torch.Tensor, positive: torch.Tensor, t: float = 2.0) -> torch.Tensor:
    """The mean of the query side's and the positive side's uniformity (the paper's loss uses both marginals)."""
    return (uniformity(query, t) + uniformity(positive, t)) / 2


def own_candidates(scores: torch.Tensor, labels: torch.Tensor, num_negatives: int) -> torch.Tensor:
    """Each row's scores of its own [positive, k hard negatives], (B, 1 + k), out of the loss's (B, C) scores.

    The candidate columns are [all positives; all hard negatives] of the (gathered) batch, each row's k negatives in
    row order (``gte_pro.training.losses``), so global row g's negatives sit at P + g k ... P + g k + k - 1 with
    P = C / (1 + k) positives."""
    positives = scores.shape[1] // (1 + num_negatives)
    negatives = positives + labels[:, None] * num_negatives + torch.arange(num_negatives, device=labels.device)
    return scores.gather(1, torch.cat([labels[:, None], negatives], dim=1))


@torch.no_grad()
def teacher_agreement(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Share of rows whose student top candidate is the teacher's top, over the teacher-scored slots; both (B, n).
    NaN when no row has two scored slots."""
    scored = torch.isfinite(teacher)
    rows = scored.sum(dim=1) >= 2  # with one candidate both tops agree trivially: not a figure of agreement
    student_top = student.float().masked_fill(~scored, float("-inf")).argmax(dim=1)
    teacher_top = teacher.float().masked_fill(~scored, float("-inf")).argmax(dim=1)
    if not rows.any():
        return torch.tensor(float("nan"), device=student.device)
    return (student_top == teacher_top)[rows].float().mean()


def _masked_ranks(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, each slot's average rank among the row's masked-in slots (ties share their mean rank), 0-based."""
    valid = mask[:, None, :]  # compare each slot i with every valid slot j of its row
    below = ((values[:, None, :] < values[:, :, None]) & valid).sum(-1).float()
    tied = ((values[:, None, :] == values[:, :, None]) & valid).sum(-1).float()
    return below + (tied - 1) / 2


@torch.no_grad()
def teacher_spearman(student: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """Spearman's rank correlation of student and teacher scores per row over the teacher-scored slots, averaged over
    the rows where it is defined (two or more slots, neither side all tied); NaN when no row qualifies."""
    mask = torch.isfinite(teacher)
    student, teacher = student.float(), teacher.float().nan_to_num(0.0)
    count = mask.sum(dim=1, keepdim=True).clamp(min=1)

    def centred(values: torch.Tensor) -> torch.Tensor:
        ranks = _masked_ranks(values, mask)
        return torch.where(mask, ranks - (ranks * mask).sum(1, keepdim=True) / count, 0.0)

    s, t = centred(student), centred(teacher)
    denominator = ((s * s).sum(1) * (t * t).sum(1)).sqrt()
    rows = (mask.sum(1) >= 2) & (denominator > 0)
    if not rows.any():
        return torch.tensor(float("nan"), device=student.device)
    return ((s * t).sum(1)[rows] / denominator[rows]).mean()


def step_telemetry(scores: torch.Tensor, labels: torch.Tensor, query: torch.Tensor | None,
                   positive: torch.Tensor | None, num_negatives: int,
                   teacher: torch.Tensor | None = None,
                   masked_share: torch.Tensor | None = None,
                   guide_masked_share: torch.Tensor | None = None) -> dict[str, float]:
    """The telemetry figures of one step, named as logged; figures that are undefined this step (NaN: a single row,
    no teacher-scored row) are left out rather than logged as NaN. ``masked_share``: the loss's share of negative
    candidates left out as false negatives (``loss.false_negative_margin``), logged as ``telemetry/masked_share``;
    ``guide_masked_share``: the guide's (``loss.guide``), as ``telemetry/guide_masked_share``."""
    figures = {"telemetry/false_negative_rate": false_negative_rate(scores, labels)}
    if masked_share is not None:
        figures["telemetry/masked_share"] = masked_share
    if guide_masked_share is not None:
        figures["telemetry/guide_masked_share"] = guide_masked_share
    if query is not None and positive is not None:
        figures["telemetry/alignment"] = alignment(query, positive)
        figures["telemetry/uniformity"] = pair_uniformity(query, positive)
    if teacher is not None and num_negatives:
        student = own_candidates(scores.detach(), labels, num_negatives)
        teacher = teacher.to(student.device)
        figures["telemetry/teacher_agreement"] = teacher_agreement(student, teacher)
        figures["telemetry/teacher_spearman"] = teacher_spearman(student, teacher)
    values = {name: float(value) for name, value in figures.items()}  # one host sync per figure, every N steps
    return {name: value for name, value in values.items() if value == value}


def telemetry_due(steps_done: int, every: int | None) -> bool:
    """Whether the step that brings the count of optimizer steps to ``steps_done`` logs telemetry: every ``every``
    steps (0 or None: never)."""
    return bool(every) and steps_done % every == 0
