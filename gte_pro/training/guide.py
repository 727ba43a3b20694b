"""The guide model of ``loss.guide`` (GISTEmbed, Solatorio 2024; sentence-transformers' ``GISTEmbedLoss``): a frozen
embedder whose similarities decide which in-batch candidates are false negatives
(``gte_pro.training.losses.partition``).

The training module holds it outside its module tree (not in the state dict, not trained, not exported, not moved
by Lightning): eval mode, no gradients, on the device of the batch. Each step it embeds the step's queries and
documents once, under ``torch.no_grad``, as unit vectors (the guide is scored by cosine, as sentence-transformers'
guide is, whatever ``loss.similarity`` the student uses).

Its input is the batch's own token ids when the guide's vocabulary is the student's (no cost but the forward: the
guide then sees the texts exactly as the student does, prefixes and truncation included); otherwise the student's
ids are decoded back to text (special and padding tokens left out) and tokenized again by the guide's tokenizer,
as sentence-transformers' ``GISTEmbedLoss`` does when ``must_retokenize``. Batches carry token ids from the token
cache, not texts, so the decoded text is what the student's tokenizer kept of it: an uncased student hands the
guide lower-cased text, and a text cut at ``model.max_length`` stays cut. That costs one decode and one tokenization
of the batch's texts per step on the CPU (a few milliseconds for a batch of a few hundred texts).

A guide is deterministic (eval mode: no dropout) and keeps no state, so a resumed run masks what an uninterrupted one
masks; under GradCache its embeddings of the whole batch are computed before the loss, once (``gte_pro.training.
module``), and under DDP each rank embeds its own rows and the loss gathers them as it gathers the student's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase

from gte_pro.models.encoder import Encoder
from gte_pro.training.gradcache import split_features
from gte_pro.training.losses import GuideEmbeddings, split_documents


def same_vocabulary(student: PreTrainedTokenizerBase, guide: PreTrainedTokenizerBase) -> bool:
    """Whether the guide can read the student's token ids as they are (sentence-transformers' test)."""
    return student.get_vocab() == guide.get_vocab()


class Guide:
    """A frozen embedder that embeds the student's tokenized batches (module docstring)."""

    def __init__(self, encoder: Encoder, student_tokenizer: PreTrainedTokenizerBase,
                 student_max_length: int | None = None) -> None:
        self.encoder = encoder.eval().requires_grad_(False)
        self.student_tokenizer = student_tokenizer
        # sentence-transformers' test: the same vocabulary, and the guide reads as many tokens as the student passes
        self.shares_tokens = same_vocabulary(student_tokenizer, encoder.tokenizer) and (
            student_max_length is None or encoder.max_length >= student_max_length)

    @classmethod
    def load(cls, name_or_path: str, student: Encoder, trust_remote_code: bool = False) -> Guide:
        """The guide at ``name_or_path``, reading texts up to the student's ``max_length`` (or its own tokenizer's
        limit, if lower); one padded pass per batch (``length_chunks=1``), so that a text's guide embedding does not
        depend on which rows share its chunk; its attention the model's own (sdpa where it has it: no warning for a
        guide such as MPNet that has none, since a user cannot choose a guide's attention)."""
        encoder = Encoder.load(name_or_path, max_length=student.max_length, trust_remote_code=trust_remote_code,
                               length_chunks=1, attn_implementation=None)
        encoder.max_length = min(encoder.max_length, int(encoder.tokenizer.model_max_length))
        return cls(encoder, student.tokenizer, student.max_length)

    def features(self, features: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The guide's input for one tokenized block of the student's batch (module docstring)."""
        ids = features["input_ids"]
        if self.shares_tokens:
            return {key: features[key] for key in self.encoder.tokenizer.model_input_names if key in features}
        texts = self.student_tokenizer.batch_decode(ids.tolist(), skip_special_tokens=True)
        return {key: value.to(ids.device) for key, value in self.encoder.tokenize(texts).items()}

    @torch.no_grad()
    def embed(self, features: Mapping[str, torch.Tensor], chunk: int | None = None) -> torch.Tensor:
        """Unit-length fp32 embeddings of one block, in chunks of ``chunk`` rows (GradCache's ``mini_batch_size``:
        the guide's activations stay within the memory the student's chunks take) or in one pass."""
        inputs = self.features(features)
        self.encoder.to(inputs["input_ids"].device)
        parts = split_features(inputs, chunk) if chunk else [inputs]
        return F.normalize(torch.cat([self.encoder(**part).float() for part in parts]), dim=-1)

    def batch(self, batch: Mapping[str, Any], chunk: int | None = None) -> GuideEmbeddings:
        """The guide's (queries, positives, hard negatives or None) of a training batch, in the loss's layout."""
        query = self.embed(batch["query"], chunk)
        positives, negatives = split_documents(self.embed(batch["doc"], chunk), query.shape[0],
                                               batch["num_negatives"])
        return query, positives, negatives
