"""Text encoder: a Hugging Face transformer plus pooling and optional L2 normalisation.

The pooling mode and normalisation are read from the model's sentence-transformers files
(``1_Pooling/config.json`` and ``modules.json``) when they exist, so that a fine-tune keeps the
geometry its checkpoint was trained with; an explicit config value overrides them.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import AutoModel, PreTrainedTokenizerBase

from gte_pro.errors import ConfigError
from gte_pro.models.heads import build_projection, load_dense_head
from gte_pro.models.length_chunks import chunks_for, parse_length_chunks, pass_plan, run_in_chunks
from gte_pro.models.loading import (
    avoid_cudnn_attention,
    check_trust_remote_code,
    enable_gradient_checkpointing,
    load_tokenizer,
    load_weights,
    prepare_tokenizer,
    random_config,
)
from gte_pro.models.lora import with_lora
from gte_pro.models.pooling import POOLING_MODES, detect_pooling, pool

log = logging.getLogger(__name__)
_HALF = (torch.float16, torch.bfloat16)


def best_attention(model_type: str, device_type: str, half: bool) -> str | None:
    """``model.attn_implementation=null``: ModernBERT's fastest attention for a pass on ``device_type``; None (the
    model's own default) for other architectures. flash_attention_2 needs the ``flash_attn`` package, a GPU and
    fp16/bf16 (on fp32 inputs it would run in the weights' fp32 and fail); its varlen kernel skips the padding's
    attention. Everywhere else sdpa: eager computes the same, slower (docs/models.md, make bench-modernbert)."""
    if model_type != "modernbert":
        return None
    if device_type == "cuda" and half and importlib.util.find_spec("flash_attn") is not None:
        return "flash_attention_2"
    return "sdpa"


class Encoder(nn.Module):
    """Transformer backbone + pooling (+ L2 normalisation) with its tokenizer attached."""

    def __init__(
        self,
        name_or_path: str,
        pooling: str | None = None,
        normalize: bool | None = None,
        max_length: int = 256,
        trust_remote_code: bool = False,
        attn_implementation: str | None = "sdpa",
        random_init_config: dict[str, Any] | None = None,
        query_prefix: str = "",
        doc_prefix: str = "",
        gradient_checkpointing: bool = False,
        compile: bool = False,
        lora: dict[str, Any] | None = None,
        projection: dict[str, Any] | None = None,
        length_chunks: int | str = "auto",
        padding_side: str | None = None,
        append_eos: bool = False,
    ) -> None:
        super().__init__()
        check_trust_remote_code(trust_remote_code)
        self.name_or_path = str(name_or_path)
        self.tokenizer: PreTrainedTokenizerBase = load_tokenizer(self.name_or_path, trust_remote_code)
        # null: chosen per device and precision at the first pass there (best_attention), not once at build time,
        # where the model is still on the CPU
        self.auto_attention = attn_implementation is None
        self._attention_key: tuple[str, bool] | None = None
        prepare_tokenizer(self.tokenizer, padding_side, append_eos)
        if random_init_config is not None:
            # a small randomly initialised BERT that shares the named tokenizer (used by tests / debug)
            config = random_config(self.tokenizer, random_init_config)
            self.backbone = AutoModel.from_config(config, attn_implementation=attn_implementation)
            detected_pooling, detected_normalize = None, None
        else:
            self.backbone = load_weights(AutoModel, self.name_or_path, trust_remote_code, attn_implementation)
            detected_pooling, detected_normalize = detect_pooling(self.name_or_path)
        # from_pretrained returns the model in eval mode; train with dropout like the peers do
        self.backbone.train()
        avoid_cudnn_attention()
        # BERT's pooler (a dense layer on [CLS]) is not used by any pooling mode here; leaving it in makes DDP wait
        # for gradients that never come. It is kept aside (not a submodule: no checkpoint or optimizer sees it) and
        # put back for save(), so that an export loads without transformers' "pooler ... MISSING" report
        self._spare_pooler: list[nn.Module] = []
        if isinstance(getattr(self.backbone, "pooler", None), nn.Module):
            self._spare_pooler.append(self.backbone.pooler)
            self.backbone.pooler = None
        self.lora = dict(lora) if lora else None
        if self.lora:
            self.backbone = with_lora(self.backbone, self.lora)
        # GTE-Pro's head on top of pooling (hidden -> 512 -> ReLU -> dropout -> 512), before normalisation; a
        # sentence-transformers folder with Dense modules (an exported run with a head) brings its own
        self.projection_settings = dict(projection) if projection else None
        self.projection = build_projection(self.hidden_dim, projection) if projection else None
        if self.projection is None and random_init_config is None:
            self.projection = load_dense_head(self.name_or_path)
        self.pooling = pooling or detected_pooling or "mean"
        if self.pooling not in POOLING_MODES:
            raise ConfigError(
                f"model.pooling={self.pooling!r} is not valid; valid choices: {', '.join(POOLING_MODES)}"
            )
        self.normalize = bool(normalize if normalize is not None else (detected_normalize
                                                                        if detected_normalize is not None
                                                                        else True))
        self.max_length = int(max_length)
        self.length_chunks = parse_length_chunks(length_chunks)
        # a compiled backbone would recompile for every chunk shape; left padding would need the other end cut
        if compile or self.tokenizer.padding_side != "right":
            self.length_chunks = 1
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix
        if gradient_checkpointing:
            enable_gradient_checkpointing(self.backbone)
        if compile:
            # in place (nn.Module.compile): parameter names, checkpoints and exports stay as without it;
            # dynamic shapes, because dynamic padding gives every batch its own length
            self.backbone.compile(dynamic=True)
        log.info("encoder %s: pooling=%s normalize=%s max_length=%d", self.name_or_path, self.pooling,
                 self.normalize, self.max_length)

    @property
    def hidden_dim(self) -> int:
        """The backbone's hidden size: what pooling returns."""
        return int(self.backbone.config.hidden_size)

    @property
    def dim(self) -> int:
        """The embedding's dimension (after the projection head, if there is one)."""
        if self.projection is None:
            return self.hidden_dim
        return [m for m in self.projection if isinstance(m, nn.Linear)][-1].out_features

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        if self.auto_attention:
            self._pick_attention(input_ids.device.type)
        plan = self._chunk_plan(attention_mask)
        if plan is None:
            return self._embed(input_ids, attention_mask, **extra)
        return run_in_chunks(self._embed, plan, input_ids, attention_mask, **extra)

    def chunks_on(self, device: torch.device) -> int:
        """The most length chunks a pass on ``device`` runs in (``model.length_chunks``)."""
        return chunks_for(self.length_chunks, device.type)

    def _pick_attention(self, device_type: str) -> None:
        """``model.attn_implementation=null``: the backbone's attention for this device and precision."""
        half = torch.is_autocast_enabled(device_type) or next(self.parameters()).dtype in _HALF
        if (device_type, half) == self._attention_key or torch.jit.is_tracing() or torch.onnx.is_in_onnx_export():
            return
        self._attention_key = (device_type, half)
        choice = best_attention(self.backbone.config.model_type, device_type, half)
        if choice and choice != self.backbone.config._attn_implementation:
            log.info("model.attn_implementation=null: %s on %s", choice, device_type)
            self.backbone.set_attn_implementation(choice)

    def _chunk_plan(self, attention_mask: torch.Tensor) -> list[tuple[np.ndarray, int]] | None:
        """The length chunks of this pass (``model.length_chunks``), or None for one pass over the padded batch."""
        return pass_plan(attention_mask, self.chunks_on(attention_mask.device))

    def _embed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **extra: torch.Tensor) -> torch.Tensor:
        if self.tokenizer.padding_side == "left" and "position_ids" not in extra:
            # left padding moves every real token right by its row's padding: positions counted over the real
            # tokens keep a text's embedding the same in any batch (and equal to right padding's)
            extra["position_ids"] = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, **extra)
        embeddings = pool(out.last_hidden_state, attention_mask, self.pooling)
        if self.projection is not None:
            embeddings = self.projection(embeddings)
        return F.normalize(embeddings, dim=-1) if self.normalize else embeddings

    def tokenize(self, texts: Sequence[str]) -> dict[str, torch.Tensor]:
        """Dynamic padding: pad to the longest text of this batch, truncate at ``max_length``."""
        return dict(self.tokenizer(list(texts), padding=True, truncation=True, max_length=self.max_length,
                                   return_tensors="pt"))

    @torch.inference_mode()
    def encode(self, texts: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """Embeddings of ``texts`` (float32, on CPU), in the order given; batches are length-sorted."""
        was_training = self.training
        self.eval()
        device = next(self.parameters()).device
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        out = torch.empty(len(texts), self.dim)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            batch = {k: v.to(device) for k, v in self.tokenize([texts[i] for i in idx]).items()}
            out[idx] = self(**batch).float().cpu()
        self.train(was_training)
        return out

    def save(self, folder: str | Path) -> None:
        """Write backbone and tokenizer in Hugging Face layout (``from_pretrained`` can read it), with the
        checkpoint's own (untrained, unused) pooler, so that the architecture's every weight is there. With LoRA,
        the adapters are merged into a copy of the weights: full weights that load without peft."""
        backbone = copy.deepcopy(self.backbone).merge_and_unload() if self.lora else self.backbone
        if self._spare_pooler:
            backbone.pooler = self._spare_pooler[0].to(next(backbone.parameters()).device)
        try:
            backbone.save_pretrained(str(folder), safe_serialization=True)
        finally:
            if self._spare_pooler:
                backbone.pooler = None
        # save_pretrained writes the tokenizer's init kwargs, which miss a padding side set after loading
        # (model.padding_side): a decoder's exports would pad on the right
        self.tokenizer.init_kwargs["padding_side"] = self.tokenizer.padding_side
        self.tokenizer.save_pretrained(str(folder))

    def save_adapter(self, folder: str | Path) -> None:
        """LoRA only: the adapter alone (``adapter_config.json`` + weights), which peft's
        ``PeftModel.from_pretrained(<base model>, folder)`` puts back on the base model."""
        if not self.lora:
            raise ValueError("save_adapter: this encoder has no LoRA adapter (model.lora is null)")
        self.backbone.save_pretrained(str(folder), safe_serialization=True)

