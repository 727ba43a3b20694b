"""(query, document) pairs for a cross-encoder, joined from the token ids of each text on its own.

The token cache holds every text tokenized alone, with its special tokens (``[CLS] q [SEP]``). A cross-encoder reads
a pair as one sequence (``[CLS] q [SEP] d [SEP]`` for BERT, ``<s> q </s></s> d </s>`` for XLM-R). ``PairTemplate``
reads where a tokenizer puts its special tokens and token types for one text and for a pair, once, and joins two
cached texts the way ``tokenizer(query, doc)`` would: the reranker trains on the same cache, sampler and batches as
the embedder, and scores raw texts (``gte_pro.models.cross_encoder``) through the same template.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from gte_pro.errors import ConfigError


def _runs(mask: Sequence[int]) -> list[tuple[int, int]]:
    """(is special, length) of each run of the special-tokens mask."""
    return [(flag, len(list(run))) for flag, run in groupby(mask)]


@dataclass(frozen=True)
class PairTemplate:
    """Where a tokenizer's special tokens and token types go around one text and around a pair."""

    single_head: int  # special tokens before a lone text ([CLS])
    single_tail: int  # ... and after it ([SEP])
    head: list[int]  # ids before the query in a pair
    middle: list[int]  # ids between query and document
    tail: list[int]  # ids after the document
    types: tuple[int, int, int, int, int]  # token type of head, query, middle, document, tail
    max_length: int

    @classmethod
    def from_tokenizer(cls, tokenizer: PreTrainedTokenizerBase, max_length: int) -> PairTemplate:
        lone = tokenizer("a", return_special_tokens_mask=True)
        pair = tokenizer("a", "b", return_special_tokens_mask=True, return_token_type_ids=True)
        lone_runs, pair_runs = _runs(lone["special_tokens_mask"]), _runs(pair["special_tokens_mask"])
        lone_text = [length for flag, length in lone_runs if not flag]
        pair_texts = [length for flag, length in pair_runs if not flag]
        if len(lone_text) != 1 or len(pair_texts) != 2:
            raise ConfigError(f"tokenizer {tokenizer.name_or_path}: cannot tell where a pair's two texts go "
                             "(it does not tokenize a text pair as one sequence); use a cross-encoder checkpoint")
        single_head = lone_runs[0][1] if lone_runs[0][0] else 0
        single_tail = lone_runs[-1][1] if lone_runs[-1][0] else 0
        ids, types = pair["input_ids"], pair.get("token_type_ids") or [0] * len(pair["input_ids"])
        spans, at = [], 0  # (start, end) of the two texts in the pair
        for flag, length in pair_runs:
            if not flag:
                spans.append((at, at + length))
            at += length
        (q_start, q_end), (d_start, d_end) = spans
        return cls(single_head=single_head, single_tail=single_tail, head=list(ids[:q_start]),
                   middle=list(ids[q_end:d_start]), tail=list(ids[d_end:]),
                   types=(types[0], types[q_start], types[q_end], types[d_start], types[-1]), max_length=max_length)

    def _core(self, ids: Sequence[int]) -> list[int]:
        """A cached text's ids without its own special tokens."""
        return list(ids[self.single_head : len(ids) - self.single_tail])

    def join(self, query: Sequence[int], doc: Sequence[int]) -> tuple[list[int], list[int]]:
        """(input ids, token type ids) of the pair, cut to ``max_length`` as the tokenizers library's
        ``longest_first`` cuts ``tokenizer(query, doc)``: the shorter text keeps up to half the room, the longer
        the rest (the query counts as shorter on a tie)."""
        q, d = self._core(query), self._core(doc)
        room = self.max_length - len(self.head) - len(self.middle) - len(self.tail)
        if len(q) + len(d) > room:
            if len(q) <= len(d):
                q = q[: min(len(q), room // 2)]
                d = d[: room - len(q)]
            else:
                d = d[: min(len(d), room // 2)]
                q = q[: room - len(d)]
        ids = self.head + q + self.middle + d + self.tail
        head_t, query_t, middle_t, doc_t, tail_t = self.types
        types = ([head_t] * len(self.head) + [query_t] * len(q) + [middle_t] * len(self.middle) + [doc_t] * len(d)
                 + [tail_t] * len(self.tail))
        return ids, types


def pad_pairs(pairs: Sequence[tuple[list[int], list[int]]], pad_id: int,
              token_types: bool) -> dict[str, torch.Tensor]:
    """Right-padded ``input_ids``, ``attention_mask`` (and ``token_type_ids``) of joined pairs."""
    width = max(len(ids) for ids, _ in pairs)
    input_ids = np.full((len(pairs), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(pairs), width), dtype=np.int64)
    type_ids = np.zeros((len(pairs), width), dtype=np.int64)
    for i, (ids, types) in enumerate(pairs):
        input_ids[i, : len(ids)], mask[i, : len(ids)], type_ids[i, : len(ids)] = ids, 1, types
    features = {"input_ids": torch.from_numpy(input_ids), "attention_mask": torch.from_numpy(mask)}
    if token_types:
        features["token_type_ids"] = torch.from_numpy(type_ids)
    return features


class PairBatcher:
    """Joins and pads pairs of cached token ids for one cross-encoder (its template, pad token, token types)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        if tokenizer.pad_token_id is None:
            raise ConfigError(f"tokenizer {tokenizer.name_or_path} has no pad token: set tokenizer.pad_token")
        self.template = PairTemplate.from_tokenizer(tokenizer, max_length)
        self.pad_id = int(tokenizer.pad_token_id)
        self.token_types = "token_type_ids" in tokenizer.model_input_names

    def __call__(self, queries: Sequence[Sequence[int]], docs: Sequence[Sequence[int]]) -> dict[str, Any]:
        pairs = [self.template.join(q, d) for q, d in zip(queries, docs, strict=True)]
        return pad_pairs(pairs, self.pad_id, self.token_types)
