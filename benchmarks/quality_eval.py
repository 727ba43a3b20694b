"""``python benchmarks/quality_eval.py OUT.json OVERRIDES...``: ``python train.py OVERRIDES...`` (meant for
``mode=eval`` of an exported model on one BEIR folder) that also writes each query's NDCG@10 to ``OUT.json``.

The project's own evaluation runs unchanged (the same Lightning validation, batches and ranking as training's);
``gte_pro.training.module.evaluate_distributed`` is wrapped so that, beside the averaged metrics, each evaluated
set's ranking is scored query by query with the project's own ``retrieval_metrics`` (one query at a time: the
average of those is the set's figure). One process only (the whole corpus is on this rank).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def per_query_ndcg(ids, embeddings, relevant, num_corpus) -> list[float]:  # noqa: ANN001
    """NDCG@10 of each query (in the set's query order) from one process's (signed id, embedding) rows."""
    from gte_pro.evaluation.metrics import TOP_K, retrieval_metrics
    from gte_pro.retrieval import rank_corpus

    num_queries = len(relevant)
    is_query = ids >= 0
    query_emb = embeddings.new_zeros((num_queries, embeddings.shape[-1]))
    corpus_emb = embeddings.new_zeros((num_corpus, embeddings.shape[-1]))
    query_emb[ids[is_query]] = embeddings[is_query]
    corpus_emb[-ids[~is_query] - 1] = embeddings[~is_query]
    ranked = rank_corpus(query_emb, corpus_emb, TOP_K).cpu()
    return [retrieval_metrics(ranked[i:i + 1], [relevant[i]])["ndcg@10"] for i in range(num_queries)]


def main(out: str, overrides: list[str]) -> None:
    sys.path.insert(0, str(REPO))
    import gte_pro.training.module as module

    original, sets = module.evaluate_distributed, []

    def recording(ids, embeddings, relevant, num_corpus, quantization=()):  # noqa: ANN001, ANN202
        metrics = original(ids, embeddings, relevant, num_corpus, quantization)
        scores = per_query_ndcg(ids, embeddings, relevant, num_corpus)
        sets.append({"ndcg@10": metrics["ndcg@10"], "per_query": scores})
        Path(out).write_text(json.dumps(sets))
        return metrics

    module.evaluate_distributed = recording
    import hydra

    from gte_pro.errors import exit_on_user_error, run_cli
    from gte_pro.train import train

    # train.py's own entry point, with its config folder named absolutely (imported, train.py's relative "conf"
    # would be looked up as a Python package)
    @hydra.main(version_base="1.3", config_path=str(REPO / "conf"), config_name="train")
    def entry(cfg):  # noqa: ANN001, ANN202
        with exit_on_user_error():
            return train(cfg)

    sys.argv = [str(REPO / "train.py"), *overrides]
    run_cli(entry)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: {sys.argv[0]} OUT.json OVERRIDES...")
    main(sys.argv[1], sys.argv[2:])
