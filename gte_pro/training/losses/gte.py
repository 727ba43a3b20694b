"""The improved contrastive loss of the GTE paper (``loss=gte``): Li et al. (2023), "Towards General Text Embeddings
with Multi-stage Contrastive Learning", eq. 3.

For pair i the partition function is one sum over query->doc s(q_i, d_j), query->query s(q_i, q_j) (j != i),
doc->query s(q_j, d_i) (j != i) and doc->doc s(d_j, d_i) (j != i) similarities; the numerator is s(q_i, d_i):

    L = -1/B sum_i log( exp(s(q_i, d_i) / t) / Z_i ),
    Z_i = sum_j exp(s(q_i, d_j) / t) + sum_{j!=i} exp(s(q_i, q_j) / t) + sum_{j!=i} exp(s(q_j, d_i) / t)
          + sum_{j!=i} exp(s(d_j, d_i) / t)

Documents d_j range over all positives and hard negatives of the global batch.
"""

from __future__ import annotations

import torch

from gte_pro.training.losses.batch import GlobalBatch
from gte_pro.training.losses.contrastive import ContrastiveLoss


class GTELoss(ContrastiveLoss):
    """GTE's partition function (module docstring).

    doc->query leaves out j == i: that term is s(q_i, d_i), the numerator, and counting it a second time (as
    sentence-transformers' MNRL with all four ``directions`` still does) puts a floor of ln 2 under the loss and
    halves the gradient on every negative once the positive dominates. ``mask_own_negatives`` also leaves d_i's
    own hard negatives out of doc->doc (as sentence-transformers' MNRL does): they were mined to look like d_i, so
    that term is often the largest in the partition function. conf/loss/gte.yaml has the measured defaults.
    """

    needs_all_queries = True

    def __init__(self, *, mask_own_negatives: bool, **shared: object) -> None:
        super().__init__(**shared)
        self.mask_own_negatives = mask_own_negatives

    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query, positive, candidates, queries_all = self._scored(batch, batch.query, batch.positive, batch.candidates,
                                                                batch.queries_all)
        labels = torch.arange(query.shape[0], device=query.device) + batch.offset
        query_doc = query @ candidates.T
        # self-similarities are constant 1/temperature terms that would swamp the denominator: drop them
        query_query = _mask(query @ queries_all.T, labels[:, None])
        # s(q_j, d_i) for the local positive d_i; j == i is the numerator itself: see the class docstring
        doc_query = _mask(positive @ queries_all.T, labels[:, None])
        doc_doc = _mask(positive @ candidates.T,
                        self._doc_doc_excluded(labels, queries_all.shape[0], batch.num_negatives))
        return torch.cat([query_doc, query_query, doc_query, doc_doc], dim=1), labels, query_doc

    def _doc_doc_excluded(self, labels: torch.Tensor, num_positives: int, k: int) -> torch.Tensor:
        """(B_local, n) candidate columns each local positive d_i is not compared with in doc->doc: itself, and with
        ``mask_own_negatives`` its own hard negatives. Candidates are [every rank's positives; every rank's
        negatives] with each rank's negatives in query order, so the k negatives of global pair g sit at columns
        num_positives + g*k ... num_positives + g*k + k-1."""
        if not (self.mask_own_negatives and k):
            return labels[:, None]
        own = num_positives + labels[:, None] * k + torch.arange(k, device=labels.device)
        return torch.cat([labels[:, None], own], dim=1)


def _mask(scores: torch.Tensor, columns: torch.Tensor) -> torch.Tensor:
    """``scores`` with row i's ``columns[i]`` set to -inf (out of the partition function)."""
    mask = torch.zeros_like(scores, dtype=torch.bool)
    mask.scatter_(1, columns, True)
    return scores.masked_fill(mask, float("-inf"))
