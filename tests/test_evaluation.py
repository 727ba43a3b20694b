"""Retrieval metrics: agreement with sentence-transformers' InformationRetrievalEvaluator, and edge cases."""

from __future__ import annotations

import pytest
import torch

from gte_pro.evaluation.metrics import evaluate_embeddings, retrieval_metrics
from gte_pro.modes.build_data import data_module
from gte_pro.retrieval import RetrievalSet, rank_corpus


def test_hand_computed_metrics():
    # query 0: relevant {1}, ranked [1, 0, 2] -> perfect; query 1: relevant {0, 2}, ranked [1, 0, 2]
    ranked = torch.tensor([[1, 0, 2], [1, 0, 2]])
    metrics = retrieval_metrics(ranked, [{1}, {0, 2}])
    import math

    dcg = 1 / math.log2(3) + 1 / math.log2(4)
    idcg = 1 + 1 / math.log2(3)
    assert metrics["ndcg@10"] == pytest.approx((1 + dcg / idcg) / 2)
    assert metrics["mrr@10"] == pytest.approx((1 + 1 / 2) / 2)
    assert metrics["recall@1"] == pytest.approx(0.5)
    assert metrics["recall@10"] == pytest.approx(1.0)
    assert metrics["map@100"] == pytest.approx((1 + (1 / 2 + 2 / 3) / 2) / 2)


def test_ties_are_broken_by_lower_corpus_index():
    query = torch.tensor([[1.0, 0.0]])
    corpus = torch.tensor([[0.0, 1.0], [1.0, 0.0], [1.0, 0.0], [0.5, 0.5]])
    assert rank_corpus(query, corpus, top_k=4).tolist() == [[1, 2, 3, 0]]


def test_retrieval_set_merges_repeated_queries_and_dedupes_documents():
    from gte_pro.data.records import Example

    rs = RetrievalSet.from_examples(
        [Example("q", ["a"], ["n"]), Example("q", ["b"]), Example("r", ["a"])], distractors=["z", "n"]
    )
    assert rs.queries == ["q", "r"]
    assert rs.corpus == ["a", "n", "b", "z"]
    assert rs.relevant == [{0, 2}, {0}]


def test_matches_sentence_transformers_information_retrieval_evaluator(cache_dir, tokenizer):
    """Same model, same data: our numbers equal sentence-transformers' to 1e-4."""
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.evaluation import InformationRetrievalEvaluator

    from gte_pro import packaged_minilm_path
    from gte_pro.models.encoder import Encoder

    data = data_module("demo", cache_dir=str(cache_dir), tokenizer=tokenizer, max_val_queries=120, max_distractors=300)
    data.setup("fit")
    rs = data.retrieval
    encoder = Encoder.load(packaged_minilm_path(), max_length=128)
    ours = evaluate_embeddings(encoder.encode(rs.queries), encoder.encode(rs.corpus), rs.relevant)

    st_model = SentenceTransformer(packaged_minilm_path(), device="cpu")
    st_model.max_seq_length = 128
    evaluator = InformationRetrievalEvaluator(
        queries={str(i): q for i, q in enumerate(rs.queries)},
        corpus={str(j): d for j, d in enumerate(rs.corpus)},
        relevant_docs={str(i): {str(j) for j in rel} for i, rel in enumerate(rs.relevant)},
        mrr_at_k=[10], ndcg_at_k=[10], accuracy_at_k=[1], precision_recall_at_k=[1, 10, 100], map_at_k=[100],
        show_progress_bar=False, name="demo",
    )
    theirs = evaluator(st_model)
    mapping = {"ndcg@10": "cosine_ndcg@10", "mrr@10": "cosine_mrr@10", "recall@1": "cosine_recall@1",
               "recall@10": "cosine_recall@10", "recall@100": "cosine_recall@100", "map@100": "cosine_map@100"}
    for mine, key in mapping.items():
        st_value = next(v for k, v in theirs.items() if k.endswith(key))
        assert ours[mine] == pytest.approx(st_value, abs=1e-4), mine
    assert 0.2 < ours["ndcg@10"] < 1.0  # a real task: the pretrained model is good but not perfect
