"""Reading, validating and cleaning training data; the demo corpus; batching."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro.data import DataError, DemoDataModule, HFDataModule, JsonlDataModule
from gte_pro.data.datamodule import PairCollator, TrainPairs
from gte_pro.data.records import Example, clean_examples, clean_text, read_pairs_jsonl
from tests.conftest import write_jsonl


def test_reads_both_layouts(tmp_path: Path):
    path = write_jsonl(tmp_path / "mixed.jsonl", [
        {"query": "q1", "positive": "p1", "negatives": ["n1", "n2"]},
        "",
        {"query": "q2", "pos": ["p2a", "p2b"], "neg": ["n3"]},
    ])
    rows = read_pairs_jsonl(path)
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
        assert len(read_pairs_jsonl(path)) == 2
    else:
        with pytest.raises(DataError, match=message):
            read_pairs_jsonl(path)


def test_missing_file_is_named(tmp_path: Path):
    with pytest.raises(DataError, match=r"nope\.jsonl: file not found"):
        read_pairs_jsonl(tmp_path / "nope.jsonl")


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
    module = JsonlDataModule(train_file=str(path), tokenizer=tokenizer)
    with pytest.raises(DataError, match="no training rows left after cleaning.*query shorter than 3"):
        module.setup("fit")


def test_jsonl_module_holds_out_a_stable_validation_split(pairs_file: Path, tokenizer):
    first = JsonlDataModule(train_file=str(pairs_file), tokenizer=tokenizer, val_fraction=0.2, batch_size=4)
    first.setup("fit")
    second = JsonlDataModule(train_file=str(pairs_file), tokenizer=tokenizer, val_fraction=0.2, batch_size=4)
    second.setup("fit")
    assert first.retrieval.queries == second.retrieval.queries
    assert 0 < len(first.retrieval.queries) < 60
    assert not set(first.retrieval.queries) & {ex.query for ex in first.train_rows}
    # validation negatives become corpus distractors; every query has exactly its positive as relevant
    assert len(first.retrieval.corpus) == 3 * len(first.retrieval.queries)
    assert all(len(rel) == 1 for rel in first.retrieval.relevant)


def test_batches_are_padded_to_the_longest_text_not_max_length(pairs_file: Path, tokenizer):
    module = JsonlDataModule(train_file=str(pairs_file), tokenizer=tokenizer, batch_size=4, num_negatives=2,
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
    rows = [Example(f"q{i}", [f"p{i}"], ["hard"] if i == 0 else []) for i in range(5)]
    pairs = TrainPairs(rows, num_negatives=2, seed=0)
    query, positive, negatives = pairs[1]
    assert (query, positive) == ("q1", "p1")
    assert len(negatives) == 2 and all(n.startswith("p") and n != "p1" for n in negatives)
    assert "hard" in pairs[0][2]


def test_collator_applies_prefixes(tokenizer):
    collate = PairCollator(tokenizer, 32, query_prefix="query: ", doc_prefix="passage: ")
    batch = collate([("what", "this", []), ("who", "that", [])])
    text = tokenizer.decode(batch["query"]["input_ids"][0], skip_special_tokens=True)
    assert text.startswith("query :") or text.startswith("query:")


def test_demo_corpus_is_real_large_enough_and_deterministic(cache_dir: Path, tokenizer):
    module = DemoDataModule(cache_dir=str(cache_dir), tokenizer=tokenizer)
    module.prepare_data()
    module.setup("fit")
    assert len(module.train_rows) >= 1000
    assert len(module.retrieval.queries) >= 100
    assert len(module.retrieval.corpus) > len(module.retrieval.queries)  # distractors
    again = DemoDataModule(cache_dir=str(cache_dir), tokenizer=tokenizer)
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
    module = HFDataModule(path=str(tmp_path / "ds"), columns={"query": "question", "positive": "answer"},
                          tokenizer=tokenizer, val_fraction=0.25, batch_size=4)
    module.setup("fit")
    assert len(module.train_rows) + len(module.retrieval.queries) == 40
    bad = HFDataModule(path=str(tmp_path / "ds"), tokenizer=tokenizer)
    with pytest.raises(DataError, match=r"no column 'query'.*columns are: question, answer"):
        bad.setup("fit")


def test_val_file_is_used_when_given(tmp_path: Path, pairs_file: Path, tokenizer):
    val = write_jsonl(tmp_path / "val.jsonl", [json.loads(line) for line in pairs_file.read_text().splitlines()[:5]])
    module = JsonlDataModule(train_file=str(pairs_file), val_file=str(val), tokenizer=tokenizer, batch_size=4)
    module.setup("fit")
    assert len(module.retrieval.queries) == 5 and len(module.train_rows) == 60
    assert isinstance(next(iter(module.val_dataloader()))["ids"], torch.Tensor)
