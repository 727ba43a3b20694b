"""InfoNCE with in-batch and hard negatives (``loss=infonce``).

For query i with positive d_i+ and the candidate documents D of the global batch (every row's positive and hard
negatives), with s the similarity and t the temperature:

    L = -1/B sum_i log( exp(s(q_i, d_i+) / t) / sum_{d in D} exp(s(q_i, d) / t) )

van den Oord, Li & Vinyals (2018), "Representation Learning with Contrastive Predictive Coding" (InfoNCE);
in-batch negatives as in Karpukhin et al. (2020), "Dense Passage Retrieval for Open-Domain Question Answering";
sentence-transformers' ``MultipleNegativesRankingLoss``.
"""

from __future__ import annotations

import torch

from gte_pro.training.losses.batch import GlobalBatch
from gte_pro.training.losses.contrastive import ContrastiveLoss


class InfoNCELoss(ContrastiveLoss):
    """Cross-entropy of each query over [all positives + all hard negatives] of the (global) batch."""

    def _partition(self, batch: GlobalBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        query, candidates = self._scored(batch, batch.query, batch.candidates)
        scores = query @ candidates.T
        return scores, torch.arange(query.shape[0], device=query.device) + batch.offset, scores
