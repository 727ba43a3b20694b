"""The model group: the embedder (and the reranker, a cross-encoder)."""

from dataclasses import dataclass
from typing import Any

from omegaconf import II, MISSING

from gte_pro.config.rules import FLAG as IS_FLAG
from gte_pro.config.rules import LENGTH_CHUNKS, choice, integer, known_keys, number
from gte_pro.config.schema.types import FLAG, redefault, setting
from gte_pro.models.heads import PROJECTION_KEYS
from gte_pro.models.lora import LORA_KEYS
from gte_pro.models.pooling import POOLING_MODES


@dataclass
class EncoderSchema:
    """Any BERT-like encoder from the Hugging Face hub or a local folder (conf/model/encoder.yaml and its presets)."""

    _target_: str = "gte_pro.models.encoder.Encoder.load"
    name_or_path: str = setting(MISSING, "hub name or local folder of the model")
    pooling: str | None = setting(None, "mean, cls or last; null: read from the model's 1_Pooling/config.json "
                                  "(sentence-transformers), else mean", choice(*POOLING_MODES, None))
    normalize: FLAG = setting(None, "L2-normalise embeddings; null: as the model's modules.json says (Normalize "
                              "module), else true", choice(True, False, None))
    max_length: int = setting(II("data.max_length"), "truncation of every text (tokens)", integer(1))
    trust_remote_code: FLAG = setting(False, "run the model's own code from the hub: only for a model you trust",
                                      IS_FLAG)
    attn_implementation: str | None = setting(
        "sdpa", "sdpa, eager, flash_attention_2, flex_attention; null: ModernBERT picks flash_attention_2 on a GPU "
        "with flash_attn and a 16-bit pass, else sdpa; other architectures transformers' default")
    gradient_checkpointing: FLAG = setting(False, "recompute activations in backward (less memory, ~30% more "
                                           "compute); see also loss.mini_batch_size", IS_FLAG)
    length_chunks: Any = setting("auto", "run each forward in at most this many chunks of similar length, each "
                                 "padded to its own longest text (same rows and loss, less padding); 1: one padded "
                                 "pass; auto: 4 on the CPU, 1 on a GPU; off with model.compile", LENGTH_CHUNKS)
    compile: FLAG = setting(False, "torch.compile the backbone (dynamic shapes); pays a compile time at start",
                            IS_FLAG)
    lora: Any = setting(None, "LoRA adapters (peft), e.g. {r: 16, alpha: 32, dropout: 0.1}; exports merge them, "
                        "<run>/adapter keeps the adapter alone; null: full fine-tuning",
                        known_keys(tuple(LORA_KEYS), "{r: 16, alpha: 32, dropout: 0.1}"))
    projection: Any = setting(None, "a head on top of pooling, before normalisation (exported as Dense modules); "
                              "activation: relu, gelu, tanh or identity; null: none",
                              known_keys(tuple(PROJECTION_KEYS), "{dims: [512, 512], activation: relu, dropout: 0.1}"))
    random_init_config: Any = setting(None, "a dict of config fields: a randomly initialised model with the named "
                                      "tokenizer (tests, debugging); BERT unless it names model_type")
    query_prefix: str = setting("", "prepended to queries (e5/bge prompts such as 'query: ', a decoder's "
                                "instruction)")
    doc_prefix: str = setting("", "prepended to documents")
    padding_side: str | None = setting(None, "left, right, or null (the tokenizer's own): decoder embedders batch "
                                       "with left padding", choice("left", "right", None))
    append_eos: FLAG = setting(False, "end every text with the tokenizer's EOS token (decoder embedders pool that "
                               "last token)", IS_FLAG)
    # its sign is torch's to check ("Invalid learning rate: -1")
    lr: float = setting(2e-5, "learning rate (the optimizer reads it); the default is the schema's: each model "
                        "option sets its own (model=minilm, the default run's: 5e-5; gte_small: 3e-5; tiny: 1e-3; "
                        "`python train.py --cfg job` shows the run's); sweep it with -m model.lr=1e-5,2e-5",
                        number(), argument=False)


@dataclass
class CrossEncoderSchema:
    """task=rerank: a cross-encoder (one logit per (query, document) pair) from the hub or a local folder
    (conf/model/cross_encoder.yaml and its presets). Any BERT-like checkpoint initialises one; a reranker
    checkpoint keeps its trained head."""

    _target_: str = "gte_pro.models.cross_encoder.CrossEncoder.load"
    name_or_path: str = redefault(EncoderSchema, "name_or_path", MISSING)
    max_length: int = setting(512, "a pair is cut to this many tokens (the longer text loses its end first)",
                              integer(1))
    trust_remote_code: FLAG = redefault(EncoderSchema, "trust_remote_code", False)
    attn_implementation: str | None = redefault(EncoderSchema, "attn_implementation", "sdpa")
    gradient_checkpointing: FLAG = redefault(EncoderSchema, "gradient_checkpointing", False)
    length_chunks: Any = redefault(EncoderSchema, "length_chunks", "auto")
    compile: FLAG = redefault(EncoderSchema, "compile", False)
    random_init_config: Any = redefault(EncoderSchema, "random_init_config", None)
    query_prefix: str = redefault(EncoderSchema, "query_prefix", "")
    doc_prefix: str = redefault(EncoderSchema, "doc_prefix", "")
    lr: float = redefault(EncoderSchema, "lr", 2e-5)
