"""A validation that can tell: the held-out queries are searched over the documents of the training rows too
(``data.val_distractors``), and the log says when a validation set is too small or saturated before training."""

from __future__ import annotations

import logging
from pathlib import Path

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.validation import saturation_warnings, training_distractors, validation_warnings
from gte_pro.modes.build_data import data_module
from gte_pro.retrieval import RetrievalSet


def _module(pairs_file: Path, tokenizer, cache_dir: Path, **options) -> ContrastiveDataModule:
    module = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, val_fraction=0.2, batch_size=4,
                         cache_dir=str(cache_dir), **options)
    module.setup("fit")
    return module


def _training_documents(module: ContrastiveDataModule) -> set[str]:
    return {text for ex in module.train_rows for text in (*ex.positives, *ex.negatives)}


def test_every_training_document_joins_the_held_out_corpus(pairs_file, tokenizer, tmp_path, caplog):
    alone = _module(pairs_file, tokenizer, tmp_path / "c", val_distractors=0)
    with caplog.at_level(logging.INFO, logger="gte_pro.data.validation"):
        searched = _module(pairs_file, tokenizer, tmp_path / "c", val_distractors=None)
    training = _training_documents(searched)
    assert len(training) == 3 * len(searched.train_rows)  # 60 rows' distinct positives and negatives, less held out
    # the held-out corpus first, unchanged, then every training document once: the same queries and qrels
    assert searched.retrieval.corpus[:len(alone.retrieval.corpus)] == alone.retrieval.corpus
    assert set(searched.retrieval.corpus[len(alone.retrieval.corpus):]) == training
    assert len(searched.retrieval.corpus) == len(alone.retrieval.corpus) + len(training)
    assert searched.retrieval.queries == alone.retrieval.queries
    assert searched.retrieval.relevant == alone.retrieval.relevant
    assert f"({len(training)} of them from the training rows)" in caplog.text


def test_the_cap_takes_a_fixed_sample_of_the_whole_data_whatever_the_seed(pairs_file, tokenizer, tmp_path):
    first = _module(pairs_file, tokenizer, tmp_path / "c", val_distractors=20, seed=1)
    second = _module(pairs_file, tokenizer, tmp_path / "c", val_distractors=20, seed=2)
    extra = first.retrieval.corpus[len(first.retrieval.corpus) - 20:]
    assert first.retrieval.corpus == second.retrieval.corpus and len(set(extra)) == 20
    assert set(extra) <= _training_documents(first)
    # a sample of every row, not the file's first rows (which are topics 0-7 at 3 documents a row)
    topics = {text.split()[1] for text in extra if text.startswith("Topic ")}
    assert any(int(topic) > 20 for topic in topics), extra


def test_documents_already_in_the_corpus_are_not_counted_twice(pairs_file, tokenizer, tmp_path):
    module = _module(pairs_file, tokenizer, tmp_path / "c", val_distractors=0)
    cache = module.token_cache
    everything = training_distractors(cache, None)
    assert len(everything) == len(set(everything)) == 3 * len(cache)
    known = everything[:10]
    rest = training_distractors(cache, None, known)
    assert set(rest) == set(everything) - set(known)
    assert training_distractors(cache, 0) == [] and len(training_distractors(cache, 7)) == 7


def _set(queries: int, documents: int) -> RetrievalSet:
    return RetrievalSet([f"q{i}" for i in range(queries)], [f"d{i}" for i in range(documents)],
                        [{i} for i in range(queries)])


def test_a_small_validation_split_is_named_with_what_gives_a_better_one():
    (line,) = validation_warnings(_set(3, 8))
    assert "the held-out split has 3 queries over 8 documents" in line
    assert "data.val_file=" in line and "eval.beir=" in line and "data.val_distractors=null" in line
    assert validation_warnings(_set(3, 5000)) and validation_warnings(_set(500, 200))
    assert validation_warnings(_set(100, 1000)) == []


def test_a_saturated_validation_before_training_is_named_per_set():
    before = {"val/ndcg@10": 0.9817, "val/mrr@10": 0.99, "val/scifact/ndcg@10": 0.62, "val/nfc/ndcg@10": 0.97,
              "val/ndcg@10_int8": 0.99}
    lines = saturation_warnings(before)
    assert len(lines) == 2
    assert lines[0].startswith("validation: NDCG@10 0.9817 on the held-out split before training")
    assert "on the nfc before training" in lines[1]
    assert saturation_warnings({"val/ndcg@10": 0.949}) == []


def test_a_negative_count_is_named_by_the_config_check(make_cfg):
    from gte_pro.config.checks import config_problems

    problems = config_problems(make_cfg(["data.val_distractors=-1"]))
    assert any(p.startswith("data.val_distractors=-1: expected an integer >= 0 or null") for p in problems), problems
