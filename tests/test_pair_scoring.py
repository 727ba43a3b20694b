"""gte_pro.scoring.pair_scoring: an embedder teacher embeds each distinct text once per job, an ensemble averages its
members' standardised scores, and the scores are the same bytes on 1 and 2 gloo ranks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist

from gte_pro import packaged_minilm_path
from gte_pro.models.teacher import CrossEncoderTeacher, EmbedderTeacher, EnsembleTeacher, standardised
from gte_pro.scoring.pair_scoring import teacher_scores
from tests.conftest import free_port
from tests.ddp_harness import spawn_ranks

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
        "initializer_range": 0.5}
QUERIES = [f"how do I use feature {i} of the library?" + " really" * (i % 5) for i in range(9)]
DOCS = [f"Feature {j} is used by calling function {j}." + " more words" * (j % 7) for j in range(30)] + [
    "Feature 3 is used by calling function 3."]  # a document that repeats another's text


def _problem() -> tuple[np.ndarray, np.ndarray]:
    """Each query with 12 documents (windows overlap, so documents recur across queries), queries recurring."""
    rng = np.random.default_rng(0)
    query_of = np.repeat(np.arange(len(QUERIES)), 12)
    doc_of = np.concatenate([rng.choice(len(DOCS), 12, replace=False) for _ in QUERIES])
    return query_of, doc_of


def _embedder(seed: int = 0) -> EmbedderTeacher:
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(seed)
    return EmbedderTeacher(Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=32,
                                        length_chunks=1))


def _cross_encoder() -> CrossEncoderTeacher:
    from gte_pro.models.cross_encoder import CrossEncoder

    torch.manual_seed(1)
    return CrossEncoderTeacher(CrossEncoder.load(packaged_minilm_path(), max_length=64, random_init_config=TINY,
                                                 length_chunks=1))


def test_an_embedder_teacher_embeds_each_distinct_text_once_and_scores_as_pair_by_pair(monkeypatch):
    teacher = _embedder()
    embedded: list[str] = []
    encode = teacher.model.encode
    monkeypatch.setattr(teacher.model, "encode", lambda texts, batch_size: embedded.extend(texts)
                        or encode(texts, batch_size))
    query_of, doc_of = _problem()
    scores = teacher_scores(teacher, QUERIES, DOCS, query_of, doc_of, batch_size=4)
    distinct_docs = {DOCS[j] for j in doc_of}
    assert len(embedded) == len(QUERIES) + len(distinct_docs) < len(query_of)  # 9 + at most 30, not 108 pairs
    assert len(set(embedded)) == len(embedded)
    monkeypatch.setattr(teacher.model, "encode", encode)
    pair_by_pair = teacher.score([QUERIES[q] for q in query_of], [DOCS[d] for d in doc_of], batch_size=4)
    torch.testing.assert_close(scores, pair_by_pair, atol=1e-6, rtol=1e-6)
    assert scores.std() > 0.01  # the pairs differ: the comparison bites


def test_an_ensemble_averages_its_members_standardised_scores():
    members = [_cross_encoder(), _embedder(seed=2)]
    query_of, doc_of = _problem()
    each = [teacher_scores(m, QUERIES, DOCS, query_of, doc_of, batch_size=8) for m in members]
    assert abs(float(each[0].mean() - each[1].mean())) > 0.05  # the members' scales differ
    ensemble = teacher_scores(EnsembleTeacher(members), QUERIES, DOCS, query_of, doc_of, batch_size=8)
    by_hand = [(s.double() - s.double().mean()) / s.double().std() for s in each]
    torch.testing.assert_close(ensemble.double(), (by_hand[0] + by_hand[1]) / 2, atol=1e-6, rtol=0)
    assert abs(float(standardised(each[0]).mean())) < 1e-6 and float(standardised(each[0]).std()) == pytest.approx(1)
    with pytest.raises(ValueError, match="at least two"):
        EnsembleTeacher(members[:1])


def _worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        query_of, doc_of = _problem()
        scores = {name: teacher_scores(teacher, QUERIES, DOCS, query_of, doc_of, batch_size=4)
                  for name, teacher in _teachers().items()}
        if rank == 0:
            torch.save(scores, out)
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _teachers() -> dict:
    return {"embedder": _embedder(), "cross-encoder": _cross_encoder(),
            "ensemble": EnsembleTeacher([_cross_encoder(), _embedder(seed=2)])}


def test_two_gloo_ranks_give_the_one_process_bytes(tmp_path: Path):
    out = tmp_path / "two.pt"
    spawn_ranks(_worker, (2, free_port(), str(out)), tmp_path)
    two = torch.load(out)
    query_of, doc_of = _problem()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as each rank: a matmul's summation order follows the thread count
    try:
        for name, teacher in _teachers().items():
            one = teacher_scores(teacher, QUERIES, DOCS, query_of, doc_of, batch_size=4)
            assert torch.equal(two[name], one), name
    finally:
        torch.set_num_threads(threads)
