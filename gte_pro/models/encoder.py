"""Text encoder: a Hugging Face transformer plus pooling and optional L2 normalisation, composed from a
``Backbone`` (gte_pro.models.backbone) and an ``EmbeddingHead`` (gte_pro.models.heads); ``Encoder.load`` builds
them from the config's keys.

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

from gte_pro.models.backbone import Backbone
from gte_pro.models.heads import EmbeddingHead
from gte_pro.models.length_chunks import chunks_for, parse_length_chunks, pass_plan, run_in_chunks
from gte_pro.models.loading import prepare_tokenizer
from gte_pro.models.pooling import pool

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
    """Transformer backbone + pooling (+ projection head) (+ L2 normalisation) with its tokenizer attached, composed
    from its parts: a ``Backbone`` (gte_pro.models.backbone) and an ``EmbeddingHead`` (gte_pro.models.heads).
    ``Encoder.load`` builds both from the ``model/`` config's keys (it is that group's ``_target_``) and is the way
    to open a folder or hub model for inference: ``Encoder.load(path, max_length=256)``."""

    def __init__(
        self,
        backbone: Backbone,
        head: EmbeddingHead,
        *,
        max_length: int = 256,
        length_chunks: int | str = "auto",
        query_prefix: str = "",
        doc_prefix: str = "",
    ) -> None:
        if not isinstance(backbone, Backbone):
            raise TypeError(f"Encoder(backbone, head) takes its parts; for a folder or hub name ({backbone!r}) use "
                            "Encoder.load(name_or_path, **options)")
        super().__init__()
        # the parts' pieces under the names checkpoints (backbone.*, projection.*), exports and callers read
        self.name_or_path = backbone.name_or_path
        self.tokenizer: PreTrainedTokenizerBase = backbone.tokenizer
        # null: chosen per device and precision at the first pass there (best_attention), not once at build time,
        # where the model is still on the CPU
        self.auto_attention = backbone.auto_attention
        self._attention_key: tuple[str, bool] | None = None
        self.backbone = backbone.model
        # not a submodule (a list): no checkpoint or optimizer sees it; save() puts it back (Backbone.set_pooler_aside)
        self._spare_pooler: list[nn.Module] = list(backbone.spare_pooler)
        self.lora = backbone.lora
        self.projection_settings = head.projection_settings
        self.projection = head.projection
        self.pooling = head.pooling
        self.normalize = head.normalize
        self.max_length = int(max_length)
        self.length_chunks = parse_length_chunks(length_chunks)
        # a compiled backbone would recompile for every chunk shape; left padding would need the other end cut
        if backbone.compiled or self.tokenizer.padding_side != "right":
            self.length_chunks = 1
        self.query_prefix = query_prefix
        self.doc_prefix = doc_prefix
        log.info("encoder %s: pooling=%s normalize=%s max_length=%d", self.name_or_path, self.pooling,
                 self.normalize, self.max_length)

    @classmethod
    def load(
        cls,
        name_or_path: str,
        *,
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
    ) -> Encoder:
        """The encoder that the ``model/`` keys describe (conf/model/encoder.yaml; EncoderSchema documents each):
        the backbone from ``name_or_path`` (weights, or ``random_init_config``'s random model), its pooler set
        aside, LoRA, the memory switches; then the head on it; then the encoder of the two."""
        backbone = Backbone.load(
            name_or_path, AutoModel, trust_remote_code=trust_remote_code, attn_implementation=attn_implementation,
            random_init_config=random_init_config,
            prepare_tokenizer=lambda tokenizer: prepare_tokenizer(tokenizer, padding_side, append_eos))
        backbone.set_pooler_aside().add_lora(lora).memory_switches(gradient_checkpointing, compile)
        head = EmbeddingHead.build(backbone.name_or_path, int(backbone.model.config.hidden_size), pooling=pooling,
                                   normalize=normalize, projection=projection,
                                   read_files=random_init_config is None)
        return cls(backbone, head, max_length=max_length, length_chunks=length_chunks, query_prefix=query_prefix,
                   doc_prefix=doc_prefix)

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

