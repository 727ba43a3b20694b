"""Sharded evaluation: 2 gloo processes, each holding a distributed sampler's share, give the 1-process numbers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch.utils.data import DistributedSampler

from gte_pro.evaluation.metrics import evaluate_distributed, evaluate_embeddings, owned_mask, retrieval_metrics
from gte_pro.evaluation.quantize import QUANTIZATIONS, int8_ranges, quantize
from gte_pro.retrieval import rank_corpus, rows_where, sharded_rank
from tests.conftest import free_port
from tests.ddp_harness import spawn_ranks

NUM_QUERIES, NUM_CORPUS, DIM = 40, 301, 16


def _problem() -> tuple[torch.Tensor, torch.Tensor, list[set[int]]]:
    """Queries near their relevant documents (non-trivial metrics), plus exact duplicate documents on both shards
    (equal scores: the lower corpus index must win, whichever rank holds it)."""
    gen = torch.Generator().manual_seed(0)
    corpus = torch.randn(NUM_CORPUS, DIM, generator=gen)
    corpus[250], corpus[251], corpus[7] = corpus[5], corpus[5], corpus[5]
    relevant = [{(3 * i) % NUM_CORPUS, (3 * i + 250) % NUM_CORPUS} for i in range(NUM_QUERIES)]
    queries = torch.stack([corpus[sorted(rel)[0]] for rel in relevant]) + 1.5 * torch.randn(NUM_QUERIES, DIM,
                                                                                              generator=gen)
    queries[0] = corpus[5]  # its top 4 are the duplicates, tied at cosine 1
    return queries, corpus, relevant


def _share(rank: int, world: int, queries_first: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(signed ids, embeddings) that rank ``rank`` of ``world`` embeds: validation's item list, length-sorted order
    stand-in (a fixed permutation; with ``queries_first``, of the queries and then of the documents, as EvalTexts
    orders them), split by a DistributedSampler (which pads with repeats: 341 items, 2 ranks)."""
    queries, corpus, _ = _problem()
    gen = torch.Generator().manual_seed(1)
    if queries_first:
        ids = torch.cat([torch.randperm(NUM_QUERIES, generator=gen), -torch.randperm(NUM_CORPUS, generator=gen) - 1])
    else:
        ids = torch.cat([torch.arange(NUM_QUERIES), -torch.arange(NUM_CORPUS) - 1])
        ids = ids[torch.randperm(len(ids), generator=gen)]
    share = ids[list(DistributedSampler(range(len(ids)), num_replicas=world, rank=rank, shuffle=False))]
    embeddings = torch.stack([queries[i] if i >= 0 else corpus[-i - 1] for i in share.tolist()])
    return share, embeddings


def _worker(rank: int, world: int, port: int, out_dir: str, queries_first: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        ids, embeddings = _share(rank, world, queries_first)
        _, _, relevant = _problem()
        metrics = evaluate_distributed(ids, embeddings, relevant, NUM_CORPUS, quantization=QUANTIZATIONS)
        # the ranking itself, from this rank's de-duplicated corpus shard
        queries, _, _ = _problem()
        keep = owned_mask(ids, NUM_QUERIES, NUM_CORPUS) & (ids < 0)
        ranked = sharded_rank(queries, embeddings[keep], -ids[keep] - 1, NUM_CORPUS, top_k=100)
        torch.save({"metrics": metrics, "ranked": ranked, "shard": int(keep.sum())}, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("queries_first", [False, True], ids=["mixed", "queries-first"])
def test_two_processes_give_the_one_process_numbers(tmp_path: Path, queries_first: bool):
    queries, corpus, relevant = _problem()
    expected = evaluate_embeddings(queries, corpus, relevant)
    expected_ranking = rank_corpus(queries, corpus, 100)
    one_process = evaluate_distributed(*_share(0, 1, queries_first), relevant, NUM_CORPUS,
                                       quantization=QUANTIZATIONS)
    assert {"ndcg@10_int8", "ndcg@10_binary"} <= set(one_process)
    spawn_ranks(_worker, (2, free_port(), str(tmp_path), queries_first), tmp_path)
    results = [torch.load(tmp_path / f"{rank}.pt", weights_only=False) for rank in range(2)]
    # each rank ranked only its half of the corpus, yet both hold the global ranking and the same metrics
    assert sum(r["shard"] for r in results) == NUM_CORPUS and max(r["shard"] for r in results) < 0.6 * NUM_CORPUS
    for result in results:
        assert torch.equal(result["ranked"], expected_ranking)
        assert {k: v for k, v in result["metrics"].items() if "_" not in k} == pytest.approx(expected, abs=1e-9)
        # the int8 ranges are a min/max over both shards: the quantized numbers match one process's too
        assert result["metrics"] == pytest.approx(one_process, abs=1e-9)
    assert 0.1 < expected["ndcg@10"] < 0.95  # a task with mistakes, so that a wrong merge would show


def test_rows_where_is_a_view_for_one_run_of_rows_and_a_copy_otherwise():
    x = torch.arange(12.0).reshape(6, 2)
    run = torch.tensor([False, True, True, True, False, False])
    assert torch.equal(rows_where(x, run), x[run]) and rows_where(x, run).data_ptr() == x[1].data_ptr()
    gaps = torch.tensor([True, False, True, False, False, True])
    assert torch.equal(rows_where(x, gaps), x[gaps])
    assert rows_where(x, torch.zeros(6, dtype=torch.bool)).shape == (0, 2)


def test_tied_duplicates_rank_by_lower_index():
    queries, corpus, _ = _problem()
    # documents 5, 7, 250, 251 are identical and query 0 is that document: index order breaks the tie
    assert rank_corpus(queries[:1], corpus, 100)[0, :4].tolist() == [5, 7, 250, 251]
    ids, embeddings = _share(0, 1)
    keep = ids < 0
    ranked = sharded_rank(queries[:1], embeddings[keep], -ids[keep] - 1, NUM_CORPUS, top_k=4)
    assert ranked.tolist() == [[5, 7, 250, 251]]


def test_one_process_matches_the_plain_evaluation_and_dedupes_repeats():
    queries, corpus, relevant = _problem()
    ids = torch.cat([torch.arange(NUM_QUERIES), -torch.arange(NUM_CORPUS) - 1, torch.tensor([0, -3])])
    embeddings = torch.cat([queries, corpus, queries[:1], corpus[2:3]])  # two repeats, as a sampler pads
    assert evaluate_distributed(ids, embeddings, relevant, NUM_CORPUS) == pytest.approx(
        evaluate_embeddings(queries, corpus, relevant), abs=1e-9)


def test_a_text_that_no_rank_embedded_is_an_error():
    queries, corpus, relevant = _problem()
    ids = torch.cat([torch.arange(NUM_QUERIES), -torch.arange(NUM_CORPUS - 1) - 1])
    with pytest.raises(RuntimeError, match=f"embedded {NUM_QUERIES + NUM_CORPUS - 1} distinct texts, expected "
                                           f"{NUM_QUERIES + NUM_CORPUS}"):
        evaluate_distributed(ids, torch.cat([queries, corpus[:-1]]), relevant, NUM_CORPUS)


def test_quantized_values_are_sentence_transformers_ones():
    from sentence_transformers.util.quantization import quantize_embeddings

    queries, corpus, _ = _problem()
    ranges = int8_ranges(corpus)
    for texts in (queries, corpus):
        theirs = quantize_embeddings(texts.numpy(), "int8", calibration_embeddings=corpus.numpy())
        assert torch.equal(quantize(texts, "int8", ranges), torch.from_numpy(theirs).float())
        bits = np.unpackbits(quantize_embeddings(texts.numpy(), "ubinary"), axis=-1)[:, :DIM]
        assert torch.equal(quantize(texts, "binary"), torch.from_numpy(bits).float() * 2 - 1)


@pytest.mark.parametrize("precision", QUANTIZATIONS)
def test_quantized_ndcg_is_that_of_the_peers_scoring(precision):
    """int8: inner product of the int8 vectors; binary: Hamming distance (ties by lower index in both)."""
    from sentence_transformers.util.quantization import quantize_embeddings

    queries, corpus, relevant = _problem()
    if precision == "int8":
        q8, c8 = (quantize_embeddings(x.numpy(), "int8", calibration_embeddings=corpus.numpy()).astype(np.int64)
                  for x in (queries, corpus))
        scores = torch.from_numpy(q8 @ c8.T).double()
    else:
        q1, c1 = (quantize_embeddings(x.numpy(), "ubinary") for x in (queries, corpus))
        hamming = np.unpackbits(q1[:, None, :] ^ c1[None, :, :], axis=-1).sum(-1)
        scores = -torch.from_numpy(hamming).double()
    # best score first, equal scores by ascending corpus index
    ranked = torch.tensor([sorted(range(NUM_CORPUS), key=lambda j, row=row: (-row[j], j))[:10]
                           for row in scores.tolist()])
    expected = retrieval_metrics(ranked, relevant)["ndcg@10"]
    ids = torch.cat([torch.arange(NUM_QUERIES), -torch.arange(NUM_CORPUS) - 1])
    ours = evaluate_distributed(ids, torch.cat([queries, corpus]), relevant, NUM_CORPUS, quantization=[precision])
    assert ours[f"ndcg@10_{precision}"] == pytest.approx(expected, abs=1e-12)
    assert ours[f"ndcg@10_{precision}"] != pytest.approx(ours["ndcg@10"], abs=1e-6)  # quantization costs something


def test_an_unknown_precision_names_the_valid_ones():
    with pytest.raises(ValueError, match=r"eval.quantization: 'int4' is not valid; valid choices: int8, binary"):
        quantize(torch.ones(2, 3), "int4")
