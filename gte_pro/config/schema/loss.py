"""The loss group: contrastive and distillation losses."""

from dataclasses import dataclass

from omegaconf import MISSING

from gte_pro.config.schema.types import FLAG


@dataclass
class InfoNCESchema:
    """InfoNCE / MultipleNegativesRanking (conf/loss/infonce.yaml); the GTE loss adds one key."""

    _target_: str = MISSING
    temperature: float = 0.05
    # under DDP: score against the documents of every rank (exact large-batch negatives)
    gather_across_devices: FLAG = True
    # cosine: score unit vectors, also for a model whose files carry no Normalize module; dot: score the embeddings
    # as the encoder returns them
    similarity: str = "cosine"
    # Matryoshka (as sentence-transformers' MatryoshkaLoss): the loss also on the first d dimensions of every
    # embedding, for each d, summed with matryoshka_weights (1 each unless set), e.g. [384, 256, 128, 64]. null: off
    matryoshka_dims: list[int] | None = None
    matryoshka_weights: list[float] | None = None
    # GradCache: embed the batch in chunks of this many texts without graphs, compute the loss on the whole batch,
    # then replay the chunks with gradients: the loss and gradients of one forward over data.batch_size in the
    # activation memory of mini_batch_size texts. strategy=fsdp is not supported. null: one forward over the batch
    mini_batch_size: int | None = None
    # non-finite guard: an optimizer step whose loss or gradient norm is NaN/inf is skipped (counted in
    # train/skipped_steps); the skip after this many stops the run, naming the step and the batch's rows. 0: stop
    # at the first one
    max_skipped_steps: int = 10


@dataclass
class GTESchema(InfoNCESchema):
    """GTE's improved contrastive loss: one partition function over q->d, q->q, d->q and d->d similarities."""

    temperature: float = 0.02
    # true: leave a document's own hard negatives out of its doc->doc terms (as sentence-transformers does)
    mask_own_negatives: FLAG = False


@dataclass
class MarginMSESchema(InfoNCESchema):
    """MarginMSE from teacher scores (conf/loss/margin_mse.yaml, gte_pro/training/losses_distill.py)."""

    # sentence-transformers' MarginMSELoss scores with the dot product (= cosine for a normalising encoder)
    similarity: str = "dot"
    # plus this times InfoNCE's in-batch term (temperature scales that term only); 0: the distillation term alone
    weight_infonce: float = 0.0


@dataclass
class DistillKLSchema(MarginMSESchema):
    """FlagEmbedding's KL distillation from teacher scores (conf/loss/distill_kl.yaml)."""

    temperature: float = 0.02  # the student's, in the distillation and the InfoNCE term
    similarity: str = "cosine"
    teacher_temperature: float = 1.0  # softmax(teacher scores / teacher_temperature)
    weight_infonce: float = 1.0  # FlagEmbedding adds its in-batch cross-entropy with weight 1


@dataclass
class ListwiseSchema:
    """task=rerank: softmax cross-entropy over each row's positive and hard negatives (conf/loss/listwise.yaml)."""

    _target_: str = MISSING
    # the logits are divided by it before the softmax; 1 = FlagEmbedding's reranker
    temperature: float = 1.0
    max_skipped_steps: int = 10


@dataclass
class PointwiseBCESchema:
    """task=rerank: binary cross-entropy on each pair (conf/loss/pointwise_bce.yaml)."""

    _target_: str = MISSING
    # weight of the positive pairs (null: 1); with k negatives per positive, k balances the classes
    pos_weight: float | None = None
    max_skipped_steps: int = 10
