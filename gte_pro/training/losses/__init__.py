"""The losses, one module each with its formula and citation; ``conf/loss/<name>.yaml`` targets them by the names
below (``gte_pro.training.losses.InfoNCELoss``).

Embedding losses (``task=embed``), over (query, positive[, hard negatives]) embeddings gathered across devices:

- ``infonce`` (:mod:`.infonce`), ``gte`` (:mod:`.gte`): a softmax over a partition function of their own;
- ``distill_kl`` (:mod:`.distill_kl`), ``margin_mse`` (:mod:`.margin_mse`): fitted to a teacher's scores
  (:mod:`.distillation`, their shared part), plus InfoNCE's term at ``weight_infonce``.

What composes with every one of them the same way (:mod:`.contrastive`): Matryoshka widths (:mod:`.matryoshka`) and
quantization-aware terms (:mod:`.quantization_aware`) wrap the loss; false-negative masking, guided masking and
hardness weighting (:mod:`.partition`) shape each query's softmax.

Reranker losses (``task=rerank``), over each row's group of pair logits: ``listwise`` (:mod:`.listwise`),
``pointwise_bce`` (:mod:`.pointwise_bce`).
"""

from gte_pro.training.losses.batch import GlobalBatch, GuideEmbeddings, LossOutput, split_documents
from gte_pro.training.losses.contrastive import ContrastiveLoss
from gte_pro.training.losses.distill_kl import DistillKLLoss
from gte_pro.training.losses.distillation import DistillationLoss
from gte_pro.training.losses.gte import GTELoss
from gte_pro.training.losses.infonce import InfoNCELoss
from gte_pro.training.losses.listwise import ListwiseLoss
from gte_pro.training.losses.margin_mse import MarginMSELoss
from gte_pro.training.losses.pointwise_bce import PointwiseBCELoss

__all__ = ["ContrastiveLoss", "DistillKLLoss", "DistillationLoss", "GTELoss", "GlobalBatch", "GuideEmbeddings",
           "InfoNCELoss", "ListwiseLoss", "LossOutput", "MarginMSELoss", "PointwiseBCELoss", "split_documents"]
