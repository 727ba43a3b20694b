"""Memory planning before a run starts: what one device will hold, estimated from the composed config, and a refusal
(with the options that would fit) when that is more than the device has or ``trainer.memory_budget`` allows.

The estimate, per device, for AdamW (the parts as Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models", count them; the coefficients measured here, see below):

- **weights**: every parameter in its storage dtype (fp32 under ``*-mixed`` and ``32-true``, bf16/fp16 under
  ``*-true``); **autocast copies**: under ``*-mixed``, the 16-bit casts of the matrix weights that the forward keeps
  for backward (2 bytes per non-embedding parameter; none for frozen LoRA weights under checkpointing).
- **gradients** and **optimizer state**: the trainable parameters once, and AdamW's two moments twice; the
  **optimizer step** also makes temporaries (the foreach kernels' intermediate lists: 1.84x the trainable bytes,
  measured), so the step's peak is weights + gradients + optimizer state + temporaries.
- **activations**: per token and layer ``c_h * hidden + c_f * intermediate`` bytes, where ``c_f`` counts the MLP's
  saved tensors (two intermediate-sized ones for a plain MLP, four for a gated one: SwiGLU, GeGLU), plus
  ``12 * heads * length`` bytes where the attention probabilities are kept (eager attention, or sdpa with attention
  dropout on the CPU); with gradient checkpointing, each layer's fp32 input and one layer's activations, recomputed in
  backward; with LoRA, the inputs of the frozen projections (output, MLP) are not kept. Tokens: ``Setup.pieces``,
  the (texts, padded length) pieces of the data's largest step (:mod:`gte_pro.preflight.batch_lengths`: its query and
  document forwards, in length chunks, or its largest GradCache mini-batch); without them, the texts of one forward
  (``loss.mini_batch_size`` under GradCache) at ``model.max_length``: the worst case, as batches are padded only
  to their longest text. The forward-backward peak is weights + optimizer
  state + autocast copies + 1.15x the activations (backward's temporaries).
- **FSDP** over n devices: weights, gradients, optimizer state and step temporaries divided by n, plus two gathered
  transformer blocks (the one running and the one prefetched) in the compute dtype.
- **loss**: the step's embeddings (every text of the device's batch, fp32) and their gradients, and the loss's
  score matrix in fp32: each local query against every candidate of the (gathered) batch (``loss=gte`` scores four
  blocks: about twice the columns), ``LOSS_MATRICES`` copies while the loss runs (the scores, the softmax that
  cross-entropy keeps, their gradient), one after it (the step's output keeps the scores for its metrics). Without
  GradCache they add to the activations; under GradCache (``loss.mini_batch_size``) the loss runs on the cached
  embeddings before the replay starts, so the forward-backward peak is the larger of the loss (states + embeddings
  + score copies) and the replay (states + its gradient buffers + one mini-batch's activations + the embeddings and
  the kept scores): the part that grows with the batch under GradCache.
- **CUDA**: 1 GiB for the context, cuBLAS workspaces and allocator rounding (an allowance, not a measurement).

The peak is the larger of the two phases. ``c_h``/``c_f`` were measured on the CPU with
:class:`gte_pro.utils.live_bytes.LiveBytes` (every live tensor's bytes) for BERT, Qwen2 and ModernBERT layers in fp32
and bf16 autocast; ``make bench-memory`` prints the estimate beside that measurement, and a test holds the estimate
within 0.85-1.3x of the measured peak for small configs of each family.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any

import torch

log = logging.getLogger(__name__)

GIB = 2**30
# bytes per token per layer, per hidden unit and per intermediate unit (plain MLP, gated MLP): measured (docstring)
ACTIVATION_BYTES = {"32": (46.0, 8.0, 16.0), "mixed": (38.0, 4.5, 8.75)}
ATTENTION_PROBS_BYTES = 12.0  # per head and key position, where the probabilities are kept
BACKWARD_TEMPORARIES = 1.15
STEP_TEMPORARIES = 1.84  # foreach AdamW's intermediates, in trainable-parameter bytes
CUDA_CONTEXT = 1 * GIB
GATED_MLP_NAMES = ("gate_proj", "gate_up_proj", "Wi", "w1")
LOSS_MATRICES = 3.0  # fp32 score-matrix copies while the loss runs (scores, cross-entropy's softmax, gradient)


@dataclass(frozen=True)
class ModelShape:
    """What the estimate reads from a model (built on the meta device: no weights are loaded)."""

    parameters: int
    trainable: int
    matrix_parameters: int  # the Linear layers' weights: what autocast casts
    largest_block: int  # the biggest FSDP unit (a transformer layer)
    layers: int
    hidden: int
    intermediate: int
    heads: int
    gated_mlp: bool
    attention_dropout: float


@dataclass(frozen=True)
class Setup:
    """What a run does on one device."""

    precision: str
    texts: int  # texts in one forward with gradients (GradCache: its mini-batch)
    tokens_per_text: int
    checkpointing: bool = False
    lora: bool = False
    shards: int = 1  # FSDP's world size (1: not sharded)
    eager_attention: bool = False
    cuda: bool = False
    # the forwards whose activations one step keeps, as (texts, padded tokens) pieces: the largest step of the data
    # (gte_pro.preflight.batch_lengths); empty: ``texts`` at ``tokens_per_text``, every text at full length
    pieces: tuple[tuple[int, int], ...] = ()
    rows: int = 0  # data.batch_size: rows per device and step
    mini_batch: int | None = None  # loss.mini_batch_size (GradCache)
    batch_texts: int = 0  # every text of the device's step: the embeddings the loss scores
    score_cells: int = 0  # the loss's score matrix: local queries x candidates of the (gathered) batch
    embedding_dim: int = 0  # 0: the model's hidden size


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device, by part; ``peak`` is what the run needs."""

    weights: float
    autocast_copies: float
    gradients: float
    optimizer: float
    step_temporaries: float
    activations: float
    gathered: float
    context: float
    full_length_peak: float = 0.0  # beside a data-based plan: the peak with every text at model.max_length
    # GradCache replays its mini-batches one by one inside backward and sums their gradients itself
    # (gte_pro.training.gradcache): from the second on, that running sum and the next one's fresh gradients are
    # held beside the replayed activations (0 without GradCache: backward frees activations as it makes gradients)
    replay_gradients: float = 0.0
    embeddings: float = 0.0  # the step's embeddings and their gradients (fp32)
    scores: float = 0.0  # one fp32 copy of the loss's score matrix
    cached: float = 0.0  # 1: GradCache (the loss runs before the replay; a number, as metrics.json keeps every field)

    @property
    def forward_backward(self) -> float:
        states = self.weights + self.optimizer + self.autocast_copies + self.gathered + self.context + self.embeddings
        if not self.cached:
            return states + BACKWARD_TEMPORARIES * self.activations + LOSS_MATRICES * self.scores
        replay = self.replay_gradients + BACKWARD_TEMPORARIES * self.activations + self.scores
        return states + max(replay, LOSS_MATRICES * self.scores)

    @property
    def optimizer_step(self) -> float:
        return self.weights + self.gradients + self.optimizer + self.step_temporaries + self.gathered + self.context

    @property
    def peak(self) -> float:
        return max(self.forward_backward, self.optimizer_step)

    def parts(self) -> str:
        named = [("weights", self.weights), ("autocast copies", self.autocast_copies), ("gradients", self.gradients),
                 ("optimizer state", self.optimizer), ("optimizer-step temporaries", self.step_temporaries),
                 ("activations", self.activations), ("embeddings", self.embeddings),
                 ("loss scores", LOSS_MATRICES * self.scores), ("gathered FSDP blocks", self.gathered),
                 ("CUDA context", self.context)]
        return ", ".join(f"{name} {gib(value)}" for name, value in named if value)


def gib(value: float) -> str:
    """Bytes for a reader: MiB below 1 GiB."""
    return f"{value / GIB:.2f} GiB" if value >= GIB else f"{value / 2**20:.0f} MiB"


def _state_bytes(precision: str) -> int:
    """Bytes of a stored weight, gradient or optimizer moment."""
    if precision.startswith("64"):
        return 8
    return 2 if precision in ("bf16-true", "16-true", "bf16", "16") else 4


def _half_activations(precision: str) -> bool:
    """Whether the forward computes in 16 bits (``*-mixed`` autocast, or ``*-true`` 16-bit weights)."""
    return "mixed" in precision or precision in ("bf16-true", "16-true")


def _per_text_parts(shape: ModelShape, setup: Setup, tokens: int) -> tuple[float, float]:
    """Saved activations of one text at ``tokens`` tokens: (what the step keeps through every layer, what backward
    recomputes one layer at a time: only with gradient checkpointing)."""
    c_h, c_plain, c_gated = ACTIVATION_BYTES["mixed" if _half_activations(setup.precision) else "32"]
    scale = 2.0 if setup.precision.startswith("64") else 1.0
    per_layer = c_h * shape.hidden + (c_gated if shape.gated_mlp else c_plain) * shape.intermediate
    if setup.lora:  # frozen projections keep no input for backward (peft's defaults adapt only attention's)
        per_layer -= (2 * shape.hidden + shape.intermediate) * (2 if _half_activations(setup.precision) else 4)
    keeps_probs = setup.eager_attention or (not setup.cuda and shape.attention_dropout > 0)
    if keeps_probs:
        per_layer += ATTENTION_PROBS_BYTES * shape.heads * tokens
    per_layer *= scale * tokens
    if setup.checkpointing:  # each layer's input (the fp32 residual stream) and one layer at a time in backward
        return (shape.layers + 2) * tokens * shape.hidden * 4 * scale, per_layer
    return shape.layers * per_layer, 0.0


def activation_bytes(shape: ModelShape, setup: Setup) -> float:
    """The activations one step keeps: ``setup.pieces`` (each (texts, padded tokens) of a forward, all kept for
    backward; with checkpointing, their layer inputs and one piece's layer recomputed at a time), else
    ``setup.texts`` at ``setup.tokens_per_text``."""
    pieces = setup.pieces or ((setup.texts, setup.tokens_per_text),)
    parts = [(texts * kept, texts * again)
             for texts, tokens in pieces for kept, again in [_per_text_parts(shape, setup, tokens)]]
    return sum(kept for kept, _ in parts) + max(again for _, again in parts)


def estimate(shape: ModelShape, setup: Setup) -> MemoryPlan:
    """The memory one device needs (module docstring)."""
    state = _state_bytes(setup.precision)
    shards = max(setup.shards, 1)
    copies = 0.0
    if "mixed" in setup.precision and shards == 1 and not (setup.lora and setup.checkpointing):
        copies = 2.0 * shape.matrix_parameters
    gathered = 2.0 * shape.largest_block * (2 if _half_activations(setup.precision) else state) if shards > 1 else 0.0
    return MemoryPlan(
        weights=shape.parameters * state / shards,
        autocast_copies=copies,
        gradients=shape.trainable * state / shards,
        optimizer=2.0 * shape.trainable * state / shards,
        step_temporaries=STEP_TEMPORARIES * shape.trainable * state / shards,
        activations=activation_bytes(shape, setup),
        gathered=gathered,
        context=CUDA_CONTEXT if setup.cuda else 0.0,
        replay_gradients=2.0 * shape.trainable * state / shards if setup.mini_batch else 0.0,
        embeddings=8.0 * setup.batch_texts * (setup.embedding_dim or shape.hidden),
        scores=4.0 * setup.score_cells,
        cached=1.0 if setup.mini_batch else 0.0,
    )


# --- the model's shape, from its config on the meta device -------------------------------------------------------
def shape_of(backbone: torch.nn.Module) -> ModelShape:
    """``backbone`` (any device, meta included) as the estimate sees it."""
    from gte_pro.launch.fsdp import no_split_layer_classes

    config = backbone.config
    blocks = no_split_layer_classes(backbone)
    block_sizes = [sum(p.numel() for p in m.parameters()) for m in backbone.modules() if type(m) in blocks]
    hidden = int(config.hidden_size)
    names = [name for name, _ in backbone.named_modules()]
    dropout = max(float(getattr(config, key, 0.0) or 0.0)
                  for key in ("attention_probs_dropout_prob", "attention_dropout"))
    return ModelShape(
        parameters=sum(p.numel() for p in backbone.parameters()),
        trainable=sum(p.numel() for p in backbone.parameters() if p.requires_grad),
        matrix_parameters=sum(m.weight.numel() for m in backbone.modules() if isinstance(m, torch.nn.Linear)),
        largest_block=max(block_sizes, default=0),
        layers=int(config.num_hidden_layers),
        hidden=hidden,
        intermediate=int(getattr(config, "intermediate_size", None) or 4 * hidden),
        heads=int(config.num_attention_heads),
        gated_mlp=any(name.rsplit(".", 1)[-1] in GATED_MLP_NAMES for name in names),
        attention_dropout=dropout,
    )


def meta_backbone(model_cfg: Any, task: str = "embed") -> torch.nn.Module:
    """The model that ``model_cfg`` names, built on the meta device (its config only: no weights are read), with
    its LoRA adapters."""
    from transformers import AutoConfig, AutoModel, AutoModelForSequenceClassification

    from gte_pro.models.loading import load_tokenizer, random_config
    from gte_pro.models.lora import with_lora

    remote = bool(model_cfg.get("trust_remote_code"))  # a model class of the user's own may not have the key
    fields = model_cfg.get("random_init_config")
    if fields is not None:
        config = random_config(load_tokenizer(str(model_cfg.name_or_path), remote), dict(fields))
    else:
        config = AutoConfig.from_pretrained(str(model_cfg.name_or_path), trust_remote_code=remote)
    model_class = AutoModelForSequenceClassification if task == "rerank" else AutoModel
    if task == "rerank":
        config.num_labels = 1  # a reranker's one-logit head
    with torch.device("meta"):
        backbone = model_class.from_config(config, trust_remote_code=remote)
    lora = model_cfg.get("lora")
    return with_lora(backbone, dict(lora)) if lora else backbone


def with_lora_shape(shape: ModelShape, rank: int = 16) -> ModelShape:
    """``shape`` with only LoRA adapters of ``rank`` on the attention projections trainable (what
    ``model.lora='{r: 16}'`` would give with peft's default targets: two matrices per layer, roughly)."""
    adapters = shape.layers * 2 * rank * (shape.hidden + shape.hidden)
    return replace(shape, parameters=shape.parameters + adapters, trainable=adapters)
