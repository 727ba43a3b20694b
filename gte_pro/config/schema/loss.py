"""The loss group: contrastive and distillation losses."""

from dataclasses import dataclass
from typing import Any

from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.rules import (
    MINI_BATCH_SIZE,
    TEACHER_TEMPERATURE,
    choice,
    int_list,
    integer,
    number,
    number_list,
    subset,
    text,
)
from gte_pro.config.schema.types import FLAG, redefault, setting

SIMILARITIES = ("cosine", "dot")


@dataclass
class InfoNCESchema:
    """InfoNCE / MultipleNegativesRanking (conf/loss/infonce.yaml); the GTE loss adds one key."""

    _target_: str = "gte_pro.training.losses.InfoNCELoss"
    temperature: float = setting(0.05, "the scores are divided by it before the softmax", number(0, open_low=True))
    gather_across_devices: FLAG = setting(True, "under DDP: score against the documents of every rank (exact "
                                          "large-batch negatives)", IS_FLAG)
    similarity: str = setting("cosine", "cosine: score unit vectors, also for a model whose files carry no "
                              "Normalize module; dot: score the embeddings as the encoder returns them",
                              choice(*SIMILARITIES))
    matryoshka_dims: list[int] | None = setting(None, "Matryoshka: the loss also on the first d dimensions of every "
                                                "embedding, for each d, e.g. [384, 256, 128, 64]; null: off",
                                                int_list(1))
    matryoshka_weights: list[float] | None = setting(None, "one weight per Matryoshka dimension (null: 1 each)",
                                                     number_list())
    quantization_aware: list[str] = setting([], "quantization-aware training: the loss also on the int8 and/or "
                                            "binary embeddings that eval.quantization ranks (straight-through "
                                            "gradients; int8 ranges exported in model/quantization.json); []: off",
                                            subset("int8", "binary"))
    quantization_weight: float = setting(1.0, "weight of each quantized term of loss.quantization_aware",
                                         number(0))
    mini_batch_size: Any = setting(
        None, "GradCache: embed the batch in chunks of this many texts, compute the loss on the whole batch, then "
        "replay the chunks with gradients (the loss of data.batch_size in the memory of this many); not with "
        "strategy=fsdp; null: one forward over the batch; auto: null where the whole batch fits "
        "trainer.memory_budget by the memory estimate, else the largest that fits (docs/losses.md)",
        MINI_BATCH_SIZE)
    max_skipped_steps: int = setting(10, "an optimizer step whose loss or gradient norm is NaN/inf is skipped; the "
                                     "skip after this many stops the run, naming the step and rows; 0: stop at the "
                                     "first", integer(0))
    false_negative_margin: float | None = setting(
        None, "false-negative masking: a candidate (another row's positive, a hard negative, GTE's extra terms) "
        "scored above the query's positive by more than this leaves the softmax's denominator (Qwen3-Embedding: "
        "0.1); null: off (docs/losses.md)", number(0, optional=True))
    hardness_alpha: float = setting(0.0, "hardness weighting: each negative's term weighted by a detached "
                                    "exp(alpha * score), normalised to mean 1 per query (LLaVE; EmbeddingGemma: 5); "
                                    "0: off, plain InfoNCE (docs/losses.md)", number(0))
    guide: Any = setting(
        None, "guided masking (GISTEmbed): a frozen embedder (hub name or folder) that embeds each batch too; a "
        "candidate it scores above its score of the query's positive (minus guide_margin) leaves the softmax's "
        "denominator; one more forward per step, no backward; null: off (docs/losses.md)", text(optional=True))
    guide_margin: float = setting(0.0, "with loss.guide: mask the candidates with guide score > guide score of the "
                                  "positive - guide_margin (sentence-transformers' GISTEmbedLoss, absolute margin); "
                                  "larger masks more", number())


@dataclass
class GTESchema(InfoNCESchema):
    """GTE's improved contrastive loss: one partition function over q->d, q->q, d->q and d->d similarities."""

    _target_: str = "gte_pro.training.losses.GTELoss"
    temperature: float = redefault(InfoNCESchema, "temperature", 0.02)
    mask_own_negatives: FLAG = setting(False, "leave a document's own hard negatives out of its doc->doc terms (as "
                                       "sentence-transformers does)", IS_FLAG)


@dataclass
class MarginMSESchema(InfoNCESchema):
    """MarginMSE from teacher scores (conf/loss/margin_mse.yaml, gte_pro/training/losses/margin_mse.py)."""

    _target_: str = "gte_pro.training.losses.MarginMSELoss"
    # sentence-transformers' MarginMSELoss scores with the dot product (= cosine for a normalising encoder)
    similarity: str = redefault(InfoNCESchema, "similarity", "dot")
    weight_infonce: float = setting(0.0, "plus this times InfoNCE's in-batch term (temperature scales that term "
                                    "only); 0: the distillation term alone", number(0))
    allow_weak_teacher: FLAG = setting(False, "distil even from a teacher that <train_file>.teacher.json shows "
                                       "ranking positives first less often than the student, or with a near-uniform "
                                       "softmax (docs/teachers.md); false: such a run is refused", IS_FLAG)


@dataclass
class DistillKLSchema(MarginMSESchema):
    """FlagEmbedding's KL distillation from teacher scores (conf/loss/distill_kl.yaml)."""

    _target_: str = "gte_pro.training.losses.DistillKLLoss"
    temperature: float = redefault(InfoNCESchema, "temperature", 0.02)  # the student's, in both terms
    similarity: str = redefault(InfoNCESchema, "similarity", "cosine")
    teacher_temperature: Any = setting("auto", "softmax(teacher scores / teacher_temperature); auto: by the "
                                       "teacher's kind in <train_file>.teacher.json (embedder 0.05, cross-encoder 1, "
                                       "ensemble its recommended one), 1 without that record", TEACHER_TEMPERATURE)
    # FlagEmbedding adds its in-batch cross-entropy with weight 1
    weight_infonce: float = redefault(MarginMSESchema, "weight_infonce", 1.0)


@dataclass
class ListwiseSchema:
    """task=rerank: softmax cross-entropy over each row's positive and hard negatives (conf/loss/listwise.yaml)."""

    _target_: str = "gte_pro.training.losses.ListwiseLoss"
    temperature: float = setting(1.0, "the logits are divided by it before the softmax; 1: FlagEmbedding's "
                                 "reranker", number(0, open_low=True))
    max_skipped_steps: int = redefault(InfoNCESchema, "max_skipped_steps", 10)


@dataclass
class PointwiseBCESchema:
    """task=rerank: binary cross-entropy on each pair (conf/loss/pointwise_bce.yaml)."""

    _target_: str = "gte_pro.training.losses.PointwiseBCELoss"
    pos_weight: float | None = setting(None, "weight of the positive pairs (null: 1); with k negatives per positive, "
                                       "k balances the classes", number(0, open_low=True, optional=True))
    max_skipped_steps: int = redefault(InfoNCESchema, "max_skipped_steps", 10)
