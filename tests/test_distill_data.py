"""Teacher scores in the data (FlagEmbedding's pos_scores / neg_scores): reading, validation (file, line, field),
cleaning (a score goes with its text), the token cache (unchanged for files without scores) and the batch's
``teacher_scores`` (B, 1 + k), with NaN for slots that have no teacher score."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from gte_pro.data.base import ContrastiveDataModule
from gte_pro.data.cache import cache_key, tokenizer_fingerprint, write_tokenized
from gte_pro.data.collate import TokenCollator
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.records import Example, clean_examples, iter_pairs_jsonl
from gte_pro.errors import DataError
from gte_pro.modes.build_data import data_module
from tests.conftest import write_jsonl


def _scored_rows(n: int = 40, negatives: int = 3) -> list[dict]:
    """Rows whose every score is derived from its text's numbers, so a batch can be checked against them."""
    return [{"query": f"what is topic number {i}?",
             "pos": [f"Topic {i} is a subject covering item {i}, version {v}." for v in range(2)],
             "neg": [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(negatives)],
             "pos_scores": [100.0 + i + v / 10 for v in range(2)],
             "neg_scores": [i + j / 10 for j in range(negatives)]} for i in range(n)]


def _module(path: Path, tokenizer, tmp_path: Path, **kwargs) -> ContrastiveDataModule:
    options = {"batch_size": 8, "num_negatives": 3, "max_length": 32, "val_fraction": 0.1, "seed": 3,
               "cache_dir": str(tmp_path / "cache")} | kwargs
    return data_module("jsonl", train_file=str(path), tokenizer=tokenizer, **options)


# --- reading and validation ---------------------------------------------------------------------------------------
def test_scores_are_read_with_their_texts(tmp_path: Path):
    rows = _scored_rows(3)
    rows[1] = {"query": "q one", "positive": "the only positive", "pos_scores": 2.5, "negatives": [],
               "neg_scores": []}
    rows[2].pop("neg_scores")  # a row without negatives may leave neg_scores out
    rows[2]["neg"] = []
    examples = list(iter_pairs_jsonl(write_jsonl(tmp_path / "s.jsonl", rows)))
    assert examples[0].pos_scores == [100.0, 100.1] and examples[0].neg_scores == [0.0, 0.1, 0.2]
    assert examples[1].pos_scores == [2.5] and examples[1].neg_scores == []
    assert examples[2].neg_scores == []


@pytest.mark.parametrize("change,message", [
    ({"neg_scores": [1.0, 2.0]}, r"line 2: field 'neg_scores' has 2 score\(s\) for the 3 text\(s\) of 'neg'"),
    ({"pos_scores": [1.0]}, r"line 2: field 'pos_scores' has 1 score\(s\) for the 2 text\(s\) of 'pos'"),
    ({"pos_scores": [1.0, "high"]}, r"line 2: field 'pos_scores' must be a list of numbers; item 1 is str"),
    ({"neg_scores": [1.0, True, 2.0]}, r"line 2: field 'neg_scores' must be a list of numbers; item 1 is bool"),
    ({"neg_scores": [1.0, float("nan"), 2.0]}, r"line 2: field 'neg_scores': item 1 is nan, expected a finite"),
    ({"pos_scores": [float("inf"), 1.0]}, r"line 2: field 'pos_scores': item 0 is inf"),
    ({"neg_scores": "0.5"}, r"line 2: field 'neg_scores' must be a list of numbers, got str"),
    ({"neg_scores": None}, r"line 2: missing field 'neg_scores' .*3 negative"),
    ({"pos_scores": None}, r"line 2: missing field 'pos_scores' .*has 'neg_scores'"),
])
def test_bad_scores_name_file_line_and_field(tmp_path: Path, change: dict, message: str):
    rows = _scored_rows(3)
    rows[1] = {key: value for key, value in (rows[1] | change).items() if value is not None}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)  # json.dumps writes NaN / Infinity, which json reads back
    with pytest.raises(DataError, match=rf"{tmp_path}/bad.jsonl, {message}"):
        list(iter_pairs_jsonl(path))


def test_a_file_is_scored_on_every_row_or_on_none(tmp_path: Path):
    rows = _scored_rows(3)
    unscored = {key: value for key, value in rows[2].items() if not key.endswith("_scores")}
    path = write_jsonl(tmp_path / "some.jsonl", rows[:2] + [unscored])
    with pytest.raises(DataError, match=r"some.jsonl, line 3: missing field 'pos_scores' \(.*line 1 has teacher"):
        list(iter_pairs_jsonl(path))
    path = write_jsonl(tmp_path / "late.jsonl", [unscored, rows[0]])
    with pytest.raises(DataError, match=r"late.jsonl, line 2: field 'pos_scores' present, but .*line 1 has no"):
        list(iter_pairs_jsonl(path))


def test_cleaning_drops_a_score_with_its_text():
    example = Example("a query", ["short", "a long enough positive", "another long positive"],
                      ["a long enough negative", "tiny", "a long enough positive", "a second long negative"],
                      [1.0, 2.0, 3.0], [4.0, 5.0, 6.0, 7.0])
    (kept,), report = clean_examples([example], "x", min_doc_chars=10)
    assert kept.positives == ["a long enough positive", "another long positive"] and kept.pos_scores == [2.0, 3.0]
    # "tiny" is too short, the third negative equals a positive: each takes its score along
    assert kept.negatives == ["a long enough negative", "a second long negative"] and kept.neg_scores == [4.0, 7.0]
    assert report.cleaned["negative equal to a positive removed"] == 1


def test_hf_reads_score_columns_and_names_the_row(tmp_path: Path, tokenizer):
    import datasets

    rows = _scored_rows(12)
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds"))
    module = data_module("hf", path=str(tmp_path / "ds"), columns={"positive": "pos", "negatives": "neg"},
                         tokenizer=tokenizer, batch_size=2, max_length=32, val_fraction=0.2,
                         cache_dir=str(tmp_path / "cache"))
    assert module.source.has_teacher_scores()
    read = list(module.source._records("train"))
    assert [r.pos_scores for r in read] == [r["pos_scores"] for r in rows]
    assert [r.neg_scores for r in read] == [r["neg_scores"] for r in rows]
    rows[5]["neg_scores"] = rows[5]["neg_scores"][:2]
    datasets.Dataset.from_list(rows).save_to_disk(str(tmp_path / "ds2"))
    module.source.path = str(tmp_path / "ds2")
    with pytest.raises(DataError, match=r"ds2\[train\], row 5: field 'neg_scores' has 2 score\(s\) for the 3 .*'neg'"):
        list(module.source._records("train"))


# --- the token cache ------------------------------------------------------------------------------------------------
# sha256 of train.arrow for these rows written by write_tokenized at 86fe696 (before teacher scores existed), with
# the packaged MiniLM tokenizer: rows without scores must keep producing the same bytes
UNSCORED_SHA256 = "f05180093710448ded852de1c2b262a3e3708d93b7daa5fe978dec57cde6fa71"


def test_rows_without_scores_write_the_same_cache_bytes_as_before(tmp_path: Path, tokenizer):
    rows = [Example(f"query number {i}", [f"a positive passage number {i}", f"another positive {i} text"],
                    [f"negative passage {i}-{j} here" for j in range(i % 3)]) for i in range(5)]
    write_tokenized(rows, tmp_path / "train.arrow", tokenizer, 32, "query: ", "passage: ", chunk_size=2)
    assert hashlib.sha256((tmp_path / "train.arrow").read_bytes()).hexdigest() == UNSCORED_SHA256


def _key_before_scores(module: ContrastiveDataModule) -> str:
    """The cache key as ContrastiveDataModule._cache_folder computed it at 86fe696."""
    tokens = module.tokens
    return cache_key({
        "source": module.source.signature(tokens), "module": module.source.module_name,
        "tokenizer": tokenizer_fingerprint(module.tokenizer), "max_length": module.max_length,
        "query_prefix": module.query_prefix, "doc_prefix": tokens.form.doc_prefix,
        "min_query_chars": tokens.min_query_chars, "min_doc_chars": tokens.min_doc_chars,
        "val_fraction": tokens.val_fraction, "max_val_queries": tokens.max_val_queries,
        "max_train_rows": tokens.max_train_rows,
    })


def test_cache_key_is_unchanged_without_scores_and_distinct_with_them(tmp_path: Path, tokenizer):
    rows = _scored_rows(10)
    plain = write_jsonl(tmp_path / "plain.jsonl",
                        [{k: v for k, v in r.items() if not k.endswith("_scores")} for r in rows])
    module = _module(plain, tokenizer, tmp_path)
    assert module.tokens.folder(module.source).name == _key_before_scores(module)
    scored = _module(write_jsonl(tmp_path / "scored.jsonl", rows), tokenizer, tmp_path)
    # a cache built from this file before scores were read has the old key: it must not be reused
    assert scored.tokens.folder(scored.source).name != _key_before_scores(scored)


# --- the batch ------------------------------------------------------------------------------------------------------
def _expected_teacher(cache, row: int, positive_ids: list[int], negative_ids: list[list[int]]) -> list[float]:
    """Each drawn text's score, found by its token ids among the row's own (NaN: not one of the row's texts)."""
    tokens, example = cache.token_rows()[row], cache.example(row)
    expected = [example.pos_scores[tokens["positives"].index(positive_ids)]]
    for ids in negative_ids:
        own = tokens["negatives"]
        expected.append(example.neg_scores[own.index(ids)] if ids in own else math.nan)
    return expected


@pytest.mark.parametrize("negatives_in_file", [3, 1])
def test_batch_teacher_scores_match_the_drawn_texts(tmp_path: Path, tokenizer, negatives_in_file: int):
    path = write_jsonl(tmp_path / "scored.jsonl", _scored_rows(40, negatives_in_file))
    module = _module(path, tokenizer, tmp_path)
    module.setup()
    assert module.token_cache.scored
    pairs = TokenizedPairs(module.token_cache.token_rows(), 3, seed=3)
    drawn = pairs.__getitems__([(r, e) for r in range(len(pairs)) for e in (0, 1)])
    batch = TokenCollator(tokenizer)(drawn[:8])
    assert batch["teacher_scores"].shape == (8, 4) and batch["teacher_scores"].dtype == torch.float32
    for item, scores in zip(drawn[:8], batch["teacher_scores"], strict=True):
        expected = _expected_teacher(module.token_cache, item.row, item.positive, item.negatives)
        torch.testing.assert_close(scores, torch.tensor(expected, dtype=torch.float32), equal_nan=True)
    filled = sum(math.isnan(s) for item in drawn for s in item.teacher)
    # with one hard negative per row the other two slots are other rows' positives: no teacher score
    assert filled == (0 if negatives_in_file == 3 else 2 * len(drawn))
    # the draw is the same as without scores: same texts for the same (row, epoch)
    plain_rows = module.token_cache.token_rows().select_columns(["query", "positives", "negatives"])
    plain = TokenizedPairs(plain_rows, 3, seed=3).__getitems__([(r, e) for r in range(len(pairs)) for e in (0, 1)])
    assert [d[:4] for d in drawn] == [p[:4] for p in plain] and all(p.teacher is None for p in plain)
    assert "teacher_scores" not in TokenCollator(tokenizer)(plain[:8])


def test_a_training_batch_from_the_data_module_carries_teacher_scores(tmp_path: Path, tokenizer):
    module = _module(write_jsonl(tmp_path / "scored.jsonl", _scored_rows(40)), tokenizer, tmp_path)
    module.setup()
    batch = next(iter(module.train_dataloader()))
    assert batch["teacher_scores"].shape == (8, 4)
    for row, scores in zip(batch["rows"].tolist(), batch["teacher_scores"].tolist(), strict=True):
        i = int(module.token_cache.example(row).query.split()[-1].rstrip("?"))
        assert 100 + i <= scores[0] <= 100.1 + i + 1e-4 and all(i <= s < i + 1 for s in scores[1:])  # float32
    meta = json.loads((module.token_cache.folder / "meta.json").read_text())
    assert meta["rows"] == len(module.token_cache)


def test_re_mined_negatives_have_no_teacher_score(tmp_path: Path, tokenizer):
    """With a re-mining pool active, a row's negatives are other rows' positives: only the positive keeps its
    teacher score."""
    module = _module(write_jsonl(tmp_path / "scored.jsonl", _scored_rows(40)), tokenizer, tmp_path)
    module.setup()

    class Pool:  # the NegativePool interface TokenizedPairs reads: (row, positive index) per mined negative
        def references(self, rows, epoch):
            return [[((r + 1) % 30, 0), ((r + 2) % 30, 0), ((r + 3) % 30, 0)] for r in rows] if epoch else None

    pairs = TokenizedPairs(module.token_cache.token_rows(), 3, seed=3, mined=Pool())
    before, after = pairs.__getitems__([(4, 0)])[0], pairs.__getitems__([(4, 1)])[0]
    assert not any(math.isnan(s) for s in before.teacher)  # epoch 0: no pool yet, the row's own scored negatives
    assert not math.isnan(after.teacher[0]) and all(math.isnan(s) for s in after.teacher[1:])


@pytest.mark.parametrize("same_source_batches", [False, True])
def test_mix_of_a_scored_and_an_unscored_source(tmp_path: Path, tokenizer, same_source_batches: bool):
    """data=mix reads each source's scores through the source's own module; the unscored source's rows have NaN
    teacher scores (left out of distillation), in batches that mix the sources and in batches of that source alone
    (which still carry teacher_scores, all NaN, so that a distillation loss does not stop the run)."""

    plain = [{k: v for k, v in row.items() if not k.endswith("_scores")} | {"query": f"plain {row['query']}"}
             for row in _scored_rows(40)]
    sources = {"scored": {"type": "jsonl", "train_file": str(write_jsonl(tmp_path / "s.jsonl", _scored_rows(40)))},
               "plain": {"type": "jsonl", "train_file": str(write_jsonl(tmp_path / "p.jsonl", plain))}}
    module = data_module("mix", sources=sources, tokenizer=tokenizer, batch_size=8, num_negatives=3, val_fraction=0.1,
                         seed=7, same_source_batches=same_source_batches, cache_dir=str(tmp_path / "cache"),
                         max_length=32)
    module.prepare_data()
    module.setup("fit")
    assert module.sources["scored"].token_cache.scored and not module.sources["plain"].token_cache.scored
    batches = list(module.train_dataloader())
    unscored = scored = 0
    for batch in batches:
        assert batch["teacher_scores"].shape == (8, 4)
        for row, scores in zip(batch["rows"].tolist(), batch["teacher_scores"], strict=True):
            from_plain = module.train_rows[row].query.startswith("plain")
            assert bool(scores.isnan().all()) == from_plain and not (scores.isnan().any() and not from_plain)
            unscored, scored = unscored + from_plain, scored + (not from_plain)
    assert unscored and scored
