"""The model group: the embedder (and the reranker, a cross-encoder)."""

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from gte_pro.config.schema.types import FLAG


@dataclass
class EncoderSchema:
    """Any BERT-like encoder from the Hugging Face hub or a local folder (conf/model/encoder.yaml and its presets)."""

    _target_: str = MISSING
    name_or_path: str = MISSING
    # mean | cls | last; null = read from the model's 1_Pooling/config.json (sentence-transformers), else mean
    pooling: str | None = None
    # L2-normalise embeddings; null = as the model's modules.json says (Normalize module), else true
    normalize: FLAG = None
    max_length: int = II("data.max_length")
    trust_remote_code: FLAG = False
    # sdpa | eager | flash_attention_2 | flex_attention | null (ModernBERT: flash_attention_2 on a GPU with
    # flash_attn installed and a 16-bit pass, else sdpa; other architectures: transformers' default)
    attn_implementation: str | None = "sdpa"
    # recompute activations in backward (less memory, ~30% more compute); see also loss.mini_batch_size
    gradient_checkpointing: FLAG = False
    # run each forward pass in at most this many chunks of similar length, each padded only to its own longest text:
    # the same rows, batch and loss, less padding computed. 1 = one pass over the padded batch. auto: 4 on the CPU,
    # 1 on a GPU (small passes wait on kernel launches). Off with model.compile (recompiles)
    length_chunks: Any = "auto"
    # torch.compile the backbone (dynamic shapes); pays a compile time at start
    compile: FLAG = False
    # LoRA adapters (peft), e.g. {r: 16, alpha: 32, dropout: 0.1}; exports merge them into full weights and
    # <run>/adapter keeps the adapter alone. null: full fine-tuning
    lora: Any = None  # a dict or null (see the module docstring)
    # a head on top of pooling, before normalisation, e.g. {dims: [512, 512], activation: relu, dropout: 0.1};
    # exported as sentence-transformers Dense modules. activation: relu | gelu | tanh | identity. null: none
    projection: Any = None  # a dict or null (see the module docstring)
    # a dict of config fields: a randomly initialised model with the named tokenizer (tests, debugging); BERT unless
    # it names another transformers architecture, e.g. {model_type: qwen2, hidden_size: 64, ...}
    random_init_config: Any = None  # a dict or null (see the module docstring)
    # prompts prepended to queries / documents (e5/bge style, e.g. "query: "; a decoder embedder's instruction,
    # "Instruct: <task>\nQuery: ")
    query_prefix: str = ""
    doc_prefix: str = ""
    # left | right | null (the tokenizer's own): decoder embedders batch with left padding
    padding_side: str | None = None
    # end every text with the tokenizer's EOS token (decoder embedders pool that last token); a tokenizer that
    # already appends it is left as it is
    append_eos: FLAG = False
    # learning rate (read by optimizer/*); sweep it with `-m model.lr=1e-5,2e-5,5e-5`
    lr: float = 2e-5


@dataclass
class CrossEncoderSchema:
    """task=rerank: a cross-encoder (one logit per (query, document) pair) from the hub or a local folder
    (conf/model/cross_encoder.yaml and its presets). Any BERT-like checkpoint initialises one; a reranker
    checkpoint keeps its trained head."""

    _target_: str = MISSING
    name_or_path: str = MISSING
    # a pair is cut to this many tokens (the longer text loses its end first)
    max_length: int = 512
    trust_remote_code: FLAG = False
    attn_implementation: str | None = "sdpa"
    gradient_checkpointing: FLAG = False
    length_chunks: Any = "auto"
    compile: FLAG = False
    random_init_config: Any = None  # config fields (any architecture: model_type), or null (tests, debugging)
    query_prefix: str = ""
    doc_prefix: str = ""
    lr: float = 2e-5
