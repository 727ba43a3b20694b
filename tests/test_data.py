"""Reading, validating and cleaning training data; the demo corpus; batching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro.data.collate import PairCollator, TokenCollator
from gte_pro.data.datasets import TokenizedPairs
from gte_pro.data.records import Example, clean_examples, clean_text, iter_pairs_jsonl
from gte_pro.data.sampling import EpochSampler
from gte_pro.errors import DataError
from gte_pro.modes.build_data import data_module
from tests.conftest import write_jsonl


def test_reads_both_layouts(tmp_path: Path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"query": "q1", "positive": "p1", "negatives": ["n1", "n2"]},
        "",
        {"query": "q2", "pos": ["p2a", "p2b"], "neg": ["n3"]},
    ])
    rows = list(iter_pairs_jsonl(path))
    assert rows == [Example("q1", ["p1"], ["n1", "n2"]), Example("q2", ["p2a", "p2b"], ["n3"])]


@pytest.mark.parametrize("line,message", [
    ('{"query": "q", "positive": "p"', r"bad\.jsonl, line 2: invalid JSON"),
    ('{"positive": "p"}', r"bad\.jsonl, line 2: missing field 'query'"),
    ('{"query": "q"}', r"bad\.jsonl, line 2: missing field 'positive'"),
    ('{"query": 3, "positive": "p"}', r"line 2: field 'query' must be a string"),
    ('{"query": "q", "positive": "p", "negatives": "n"}', None),  # one string is accepted as a list
    ('{"query": "q", "positive": "p", "negatives": [1]}', r"line 2: field 'negatives' must be a string or a list"),
    ('["q", "p"]', r"line 2: expected a JSON object"),
])
def test_bad_rows_name_file_line_and_field(tmp_path: Path, line: str, message: str | None):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"query": "ok", "positive": "fine"}\n' + line + "\n")
    if message is None:
        assert len(list(iter_pairs_jsonl(path))) == 2
    else:
        with pytest.raises(DataError, match=message):
            list(iter_pairs_jsonl(path))


def test_missing_file_is_named(tmp_path: Path):
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        list(iter_pairs_jsonl(tmp_path / "nope.jsonl"))


def test_cleaning_collapses_whitespace_drops_control_chars_and_counts_reasons():
    assert clean_text("  a\t\tb\n\nc\x00d\u200b e ") == "a b c d e"
    rows = [
        Example("good query", ["a long enough positive"]),
        Example("good query", ["a long enough positive"]),  # duplicate
        Example("q", ["a long enough positive"]),  # query too short
        Example("another query", ["short"]),  # positive too short
        Example("third query", ["a long enough positive"], ["tiny", "a long enough negative"]),
    ]
    kept, report = clean_examples(rows, "unit", min_query_chars=3, min_doc_chars=10)
    assert [ex.query for ex in kept] == ["good query", "third query"]
    assert kept[1].negatives == ["a long enough negative"]
    assert report.read == 5 and report.kept == 2
    assert report.dropped == {"duplicate (query, positive)": 1, "query shorter than 3 chars": 1,
                              "no positive of 10+ chars": 1}
    assert "read 5 rows, kept 2, dropped 3" in report.summary()


def test_zero_rows_after_cleaning_is_an_error_naming_the_reasons(tmp_path: Path, tokenizer):
    path = write_jsonl(tmp_path / "tiny.jsonl", [{"query": "q", "positive": "p"}] * 3)
    module = data_module("jsonl", train_file=str(path), tokenizer=tokenizer)
    with pytest.raises(DataError, match="no training rows left after cleaning.*query shorter than 3"):
        module.setup("fit")


def test_jsonl_module_holds_out_a_stable_validation_split(pairs_file: Path, tokenizer):
    # the held-out part of the corpus only (data.val_distractors=0): tests/test_validation_corpus.py adds the rest
    first = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, val_fraction=0.2, batch_size=4,
                        val_distractors=0)
    first.setup("fit")
    second = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, val_fraction=0.2, batch_size=4,
                         val_distractors=0)
    second.setup("fit")
    assert first.retrieval.queries == second.retrieval.queries
    assert 0 < len(first.retrieval.queries) < 60
    assert not set(first.retrieval.queries) & {ex.query for ex in first.train_rows}
    # validation negatives become corpus distractors; every query has exactly its positive as relevant
    assert len(first.retrieval.corpus) == 3 * len(first.retrieval.queries)
    assert all(len(rel) == 1 for rel in first.retrieval.relevant)


def test_batches_are_padded_to_the_longest_text_not_max_length(pairs_file: Path, tokenizer):
    module = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, batch_size=4, num_negatives=2,
                         max_length=256)
    module.setup("fit")
    batch = next(iter(module.train_dataloader()))
    assert batch["query"]["input_ids"].shape[0] == 4
    assert batch["doc"]["input_ids"].shape[0] == 4 * 3  # positives then 2 negatives per row
    longest = max(len(tokenizer(q)["input_ids"]) for q in tokenizer.batch_decode(
        batch["query"]["input_ids"], skip_special_tokens=True))
    assert batch["query"]["input_ids"].shape[1] == longest < 256
    assert batch["num_tokens"] == int(batch["query"]["attention_mask"].sum() + batch["doc"]["attention_mask"].sum())


def test_missing_negatives_are_filled_with_other_positives():
    import datasets

    # token ids stand for texts: query i = [i], positive i = [100 + i], row 0's hard negative = [999]
    rows = datasets.Dataset.from_dict({"query": [[i] for i in range(5)],
                                       "positives": [[[100 + i]] for i in range(5)],
                                       "negatives": [[[999]] if i == 0 else [] for i in range(5)]})
    pairs = TokenizedPairs(rows, num_negatives=2, seed=0)
    query, positive, negatives, row = pairs[1][:4]  # [4]: teacher scores (None: the rows have none)
    assert (query, positive, row) == ([1], [101], 1)
    assert len(negatives) == 2 and all(100 <= n[0] < 105 and n != [101] for n in negatives)
    assert [999] in pairs[0].negatives
    batch = pairs.__getitems__([(2, 0), (3, 0)])  # the DataLoader's batched fetch draws the same way
    assert [(r.query, r.positive, r.row) for r in batch] == [([2], [102], 2), ([3], [103], 3)]
    assert pairs.__getitems__([(1, 0)]) == [pairs[1]] == [pairs[(1, 0)]]  # a pure function of (row, epoch)
    assert any(pairs[(1, epoch)].negatives != pairs[1].negatives for epoch in range(1, 6))


def test_cached_token_batches_equal_tokenizing_the_texts(pairs_file: Path, tokenizer):
    """The tensors from the token cache are exactly what tokenizing the texts in each batch gives."""
    module = data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer, batch_size=4, num_negatives=2,
                         max_length=24, query_prefix="query: ", doc_prefix="passage: ")
    module.setup("fit")
    pairs = module.train_dataloader().dataset
    indices = [0, 5, 7]
    drawn = pairs.__getitems__(indices)
    from_cache = TokenCollator(tokenizer)(drawn)
    texts = []
    for index, negative_ids in zip(indices, [row.negatives for row in drawn], strict=True):
        example = module.train_rows[index]
        # the negatives are drawn in a random order: name each by the text it was tokenized from
        by_ids = {tuple(tokenizer("passage: " + n, truncation=True, max_length=24)["input_ids"]): n
                  for n in example.negatives}
        texts.append((example.query, example.positives[0], [by_ids[tuple(ids)] for ids in negative_ids]))
    from_texts = PairCollator(tokenizer, 24, query_prefix="query: ", doc_prefix="passage: ")(texts)
    for side in ("query", "doc"):
        assert from_cache[side].keys() == from_texts[side].keys()
        for name, tensor in from_texts[side].items():
            assert torch.equal(from_cache[side][name], tensor), (side, name)
    assert from_cache["num_tokens"] == from_texts["num_tokens"]


def test_token_cache_is_reused_and_rebuilt_when_the_file_changes(tmp_path: Path, pairs_file: Path, tokenizer,
                                                                 monkeypatch):
    from gte_pro.data import token_cache

    builds = []
    real_write = token_cache.write_tokenized
    monkeypatch.setattr(token_cache, "write_tokenized", lambda *a, **k: builds.append(1) or real_write(*a, **k))
    make = lambda: data_module("jsonl", train_file=str(pairs_file), tokenizer=tokenizer,  # noqa: E731
                               cache_dir=str(tmp_path / "c"), val_fraction=0.2)
    first = make()
    first.prepare_data()
    first.setup("fit")
    second = make()
    second.setup("fit")
    assert len(builds) == 1 and second.token_cache.folder == first.token_cache.folder
    assert [ex.query for ex in second.train_rows] == [ex.query for ex in first.train_rows]
    lines = pairs_file.read_text().splitlines()
    pairs_file.write_text("\n".join(lines[:40]) + "\n")  # an edited file must not reuse the stale cache
    third = make()
    third.setup("fit")
    assert len(builds) == 2 and third.token_cache.folder != first.token_cache.folder
    assert len(third.train_rows) + len(third.retrieval.queries) == 40
    assert not list((tmp_path / "c" / "tokenized").glob("*.tmp*"))  # no half-written build left behind


def test_a_failed_build_leaves_no_cache(tmp_path: Path, tokenizer):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"query": "a real question", "positive": "a long enough answer"},
                                                {"query": "q2", "positive": 3}])
    module = data_module("jsonl", train_file=str(path), tokenizer=tokenizer, cache_dir=str(tmp_path / "c"))
    with pytest.raises(DataError, match=r"bad\.jsonl, line 2: field 'positive'"):
        module.setup("fit")
    assert not any((tmp_path / "c" / "tokenized").iterdir())


def test_length_grouped_sampler_is_a_deterministic_shuffled_permutation_of_similar_length_batches():
    lengths = torch.randint(5, 300, (1000,), generator=torch.Generator().manual_seed(0)).numpy()
    sampler = EpochSampler(1000, batch_size=16, seed=3, lengths=lengths, window_batches=10)
    first = [row for row, epoch in sampler]
    assert len(first) == len(set(first)) == 992 == len(sampler)  # 62 full batches; the partial one is never used
    assert first == [row for row, _ in sampler] and {epoch for _, epoch in sampler} == {0}
    sampler.set_epoch(1)
    assert [row for row, _ in sampler] != first and {epoch for _, epoch in sampler} == {1}
    batches = [first[i : i + 16] for i in range(0, 992, 16)]
    spread = sum(int(lengths[b].max() - lengths[b].min()) for b in batches) / len(batches)
    shuffled = torch.randperm(1000, generator=torch.Generator().manual_seed(1)).tolist()
    random_spread = sum(int(lengths[shuffled[i : i + 16]].max() - lengths[shuffled[i : i + 16]].min())
                        for i in range(0, 992, 16)) / 62
    assert spread < 0.2 * random_spread
    # batch order is shuffled: not longest-first across the epoch
    maxima = [int(lengths[b].max()) for b in batches]
    assert maxima != sorted(maxima, reverse=True)


def test_group_by_length_loader_pads_less(tmp_path: Path, tokenizer):
    rows = [{"query": f"question {i}", "positive": " ".join(["word"] * (5 + (i * 37) % 60))} for i in range(80)]
    path = write_jsonl(tmp_path / "varied.jsonl", rows)

    def padding(group: bool) -> float:
        module = data_module("jsonl", train_file=str(path), tokenizer=tokenizer, batch_size=4, val_fraction=0.1,
                             group_by_length=group, length_window=8)
        module.setup("fit")
        real = padded = 0
        for batch in module.train_dataloader():
            real += int(batch["doc"]["attention_mask"].sum())
            padded += batch["doc"]["input_ids"].numel()
        return 1 - real / padded

    assert padding(True) < padding(False)


def test_collator_applies_prefixes(tokenizer):
    collate = PairCollator(tokenizer, 32, query_prefix="query: ", doc_prefix="passage: ")
    batch = collate([("what", "this", ["nope"]), ("who", "that", ["never"])])

    def texts(side: str) -> list[str]:
        return tokenizer.batch_decode(batch[side]["input_ids"], skip_special_tokens=True)

    spaced = lambda text: tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)  # noqa: E731
    assert texts("query") == [spaced("query: what"), spaced("query: who")]
    # documents: the positives first, then the hard negatives, each with the document prefix
    assert texts("doc") == [spaced(f"passage: {t}") for t in ("this", "that", "nope", "never")]


def test_demo_corpus_is_real_large_enough_and_deterministic(cache_dir: Path, tokenizer):
    module = data_module("demo", cache_dir=str(cache_dir), tokenizer=tokenizer)
    module.prepare_data()
    module.setup("fit")
    assert len(module.train_rows) >= 1000
    assert len(module.retrieval.queries) >= 100
    assert len(module.retrieval.corpus) > len(module.retrieval.queries)  # distractors
    again = data_module("demo", cache_dir=str(cache_dir), tokenizer=tokenizer)
    again.setup("fit")
    assert again.retrieval.queries == module.retrieval.queries
    report = module.reports[0]
    assert report["read"] > report["kept"] >= 1000 and report["dropped"]
    # cleaned: no control characters and no runs of whitespace survive
    assert all("  " not in ex.positives[0] and "\n" not in ex.positives[0] for ex in module.train_rows)


def test_hf_module_maps_columns_and_names_missing_ones(tmp_path: Path, tokenizer):
    import datasets

    table = datasets.Dataset.from_dict({
        "question": [f"question number {i}" for i in range(40)],
        "answer": [f"the answer to question {i} is a long sentence" for i in range(40)],
    })
    table.save_to_disk(str(tmp_path / "ds"))
    module = data_module("hf", path=str(tmp_path / "ds"), columns={"query": "question", "positive": "answer"},
                         tokenizer=tokenizer, val_fraction=0.25, batch_size=4)
    module.setup("fit")
    assert len(module.train_rows) + len(module.retrieval.queries) == 40
    bad = data_module("hf", path=str(tmp_path / "ds"), tokenizer=tokenizer)
    with pytest.raises(DataError, match=r"no column 'query'.*columns are: question, answer"):
        bad.setup("fit")


def test_val_file_is_used_when_given(tmp_path: Path, pairs_file: Path, tokenizer):
    val = write_jsonl(tmp_path / "val.jsonl", [json.loads(line) for line in pairs_file.read_text().splitlines()[:5]])
    module = data_module("jsonl", train_file=str(pairs_file), val_file=str(val), tokenizer=tokenizer, batch_size=4,
                         val_distractors=0)
    module.setup("fit")
    assert len(module.retrieval.queries) == 5 and len(module.train_rows) == 60
    # the validation loader embeds each of the file's 5 queries and each corpus document (5 positives and their
    # 10 negatives) exactly once: ids i >= 0 are queries, -(j + 1) corpus entries
    ids = torch.cat([batch["ids"] for batch in module.val_dataloader()]).tolist()
    assert sorted(ids) == list(range(-15, 0)) + list(range(5))
    assert module.retrieval.queries == [json.loads(line)["query"] for line in val.read_text().splitlines()]
