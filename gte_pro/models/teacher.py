"""Teachers: a model that scores (query, document) pairs, for ``mode=score`` and ``mode=mine mine.rescore_with=``.

A teacher is a cross-encoder (a folder or hub name whose ``config.json`` names a ``*ForSequenceClassification``
architecture: gte-pro's ``task=rerank`` exports, sentence-transformers' CrossEncoder folders, BAAI/bge-reranker-*,
Alibaba-NLP/gte-*-reranker-*), scoring each pair with its logit, or any embedder, scoring each pair with the
similarity of the two embeddings (cosine when the embedder normalises, as the embedder's own training does), or an
ensemble of several teachers (a list: ``score.teacher=[a,b,c]``), whose scores are each member's standardised over
the job's pairs, averaged (``gte_pro.scoring.pair_scoring``).

A job scores its pairs through ``gte_pro.scoring.pair_scoring.teacher_scores``, which embeds each distinct text of an
embedder teacher once per job; ``Teacher.score`` scores the pairs it is given, as one call.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import torch

from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.models.encoder import Encoder


class Teacher(Protocol):
    kind: str  # "cross-encoder" or "embedder"
    name_or_path: str

    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """One float32 score per (queries[i], docs[i]) pair, on the CPU; higher means more relevant."""
        ...

    def to(self, device: torch.device | str) -> Teacher: ...


class CrossEncoderTeacher:
    kind = "cross-encoder"

    def __init__(self, model: CrossEncoder) -> None:
        self.model = model.eval()
        self.name_or_path = model.name_or_path

    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        return self.model.score(queries, docs, batch_size)

    def to(self, device: torch.device | str) -> CrossEncoderTeacher:
        self.model.to(device)
        return self


class EmbedderTeacher:
    kind = "embedder"

    def __init__(self, model: Encoder) -> None:
        self.model = model.eval()
        self.name_or_path = model.name_or_path

    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        """Each distinct text of the call is embedded once (a row's query recurs with each of its documents)."""
        if len(queries) != len(docs):
            raise ValueError(f"score: {len(queries)} queries for {len(docs)} documents")
        distinct_queries = list(dict.fromkeys(queries))
        distinct_docs = list(dict.fromkeys(docs))
        query_emb = self.model.encode([self.model.query_prefix + q for q in distinct_queries], batch_size)
        doc_emb = self.model.encode([self.model.doc_prefix + d for d in distinct_docs], batch_size)
        query_row = {text: i for i, text in enumerate(distinct_queries)}
        doc_row = {text: i for i, text in enumerate(distinct_docs)}
        q = query_emb[torch.tensor([query_row[text] for text in queries], dtype=torch.long)]
        d = doc_emb[torch.tensor([doc_row[text] for text in docs], dtype=torch.long)]
        return (q * d).sum(dim=-1)

    def to(self, device: torch.device | str) -> EmbedderTeacher:
        self.model.to(device)
        return self


def standardised(scores: torch.Tensor) -> torch.Tensor:
    """(s - mean) / std over all the job's pairs (float64 statistics; std 0: centred only)."""
    values = scores.double()
    std = float(values.std()) if len(values) > 1 else 0.0
    return ((values - values.mean()) / (std if std > 0 else 1.0)).float()


class EnsembleTeacher:
    """Several teachers as one: each member's scores standardised over the pairs scored together (a job's pairs in
    ``gte_pro.scoring.pair_scoring``, the pairs of one call here), averaged."""

    kind = "ensemble"

    def __init__(self, members: Sequence[Teacher]) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two teachers")
        self.members = list(members)
        self.name_or_path = "[" + ", ".join(member.name_or_path for member in self.members) + "]"

    def score(self, queries: Sequence[str], docs: Sequence[str], batch_size: int = 64) -> torch.Tensor:
        scores = [standardised(member.score(queries, docs, batch_size).float().cpu()) for member in self.members]
        return torch.stack(scores).double().mean(0).float()

    def to(self, device: torch.device | str) -> EnsembleTeacher:
        for member in self.members:
            member.to(device)
        return self


def is_cross_encoder(name_or_path: str | Path) -> bool:
    """Whether a local folder holds a sequence-classification checkpoint (hub names: see ``load_teacher``)."""
    config = Path(name_or_path).expanduser() / "config.json"
    if not config.is_file():
        return False
    architectures = json.loads(config.read_text(encoding="utf-8")).get("architectures") or []
    return any(name.endswith("ForSequenceClassification") for name in architectures)


def load_teacher(name_or_path: str | Sequence[str], max_length: int = 512, trust_remote_code: bool = False,
                 kind: str | None = None) -> Teacher:
    """The teacher at ``name_or_path``, or the ensemble of the teachers of a list. ``kind``: ``cross-encoder`` or
    ``embedder`` (for every member of a list); None: a local folder says which by its ``config.json``, and a hub name
    is read as a cross-encoder (the usual teacher)."""
    if not isinstance(name_or_path, str | Path):
        members = [load_teacher(str(name), max_length, trust_remote_code, kind) for name in name_or_path]
        return members[0] if len(members) == 1 else EnsembleTeacher(members)
    folder = Path(str(name_or_path)).expanduser()
    if kind is None:
        kind = "cross-encoder" if is_cross_encoder(folder) or not folder.exists() else "embedder"
    # one padded pass per batch: a teacher's scores are what it writes into the file, and a text's length chunk (so
    # its padding and float rounding) would depend on which rows share its batch, hence on the shard and rank
    if kind == "cross-encoder":
        return CrossEncoderTeacher(CrossEncoder.load(str(name_or_path), max_length=max_length,
                                                     trust_remote_code=trust_remote_code, length_chunks=1))
    return EmbedderTeacher(Encoder.load(str(name_or_path), max_length=max_length, trust_remote_code=trust_remote_code,
                                        length_chunks=1))
