"""BEIR folders: reading, errors that name file/line/id, eval.beir specs, and data=beir as training data."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from gte_pro.data.beir import load_beir
from gte_pro.data.beir_rows import BeirRows
from gte_pro.errors import DataError
from gte_pro.evaluation.sets import eval_set_specs, load_eval_sets
from gte_pro.modes.build_data import build_datamodule, data_module
from tests.beir_data import SPLITS, TOPICS, write_beir_folder


@pytest.fixture
def beir_dir(tmp_path: Path) -> Path:
    return write_beir_folder(tmp_path / "scifake")


def test_load_beir_keeps_ids_joins_titles_and_uses_binary_relevance(beir_dir: Path):
    test = load_beir(beir_dir, "test")
    assert test.name == "scifake" and len(test.corpus) == len(test.corpus_ids) == 36
    assert test.query_ids == [f"q{i}" for i in SPLITS["test"]]
    assert test.corpus[0] == f"{TOPICS[0][0]} {TOPICS[0][1]}"  # title + " " + text
    by_id = dict(zip(test.query_ids, test.relevant, strict=True))
    assert {test.corpus_ids[j] for j in by_id["q25"]} == {"d25", "x5"}
    assert {test.corpus_ids[j] for j in by_id["q22"]} == {"d22"}  # the score-0 judgement is not relevant
    assert load_beir(beir_dir, "dev", name="dev_set").name == "dev_set"


def test_queries_whose_judgements_are_all_zero_are_left_out(beir_dir: Path):
    (beir_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t0\nq2\td2\t2\n")
    assert load_beir(beir_dir, "test").query_ids == ["q2"]
    (beir_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq1\td1\t0\n")
    with pytest.raises(DataError, match=r"test\.tsv: no query has a relevant document"):
        load_beir(beir_dir, "test")


def _break(folder: Path, file: str, line_no: int, text: str) -> None:
    path = folder / file
    lines = path.read_text().splitlines()
    lines[line_no - 1] = text
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("file,line_no,text,message", [
    ("corpus.jsonl", 3, '{"_id": "d2", "text": "unterminated', r"corpus\.jsonl, line 3: invalid JSON"),
    ("queries.jsonl", 5, '{"text": "no id"}', r"queries\.jsonl, line 5: field '_id' is missing"),
    ("corpus.jsonl", 4, '{"_id": "d3", "title": "T", "text": 7}',
     r"corpus\.jsonl, line 4 \(_id 'd3'\): field 'text' must be a string, got int"),
    ("corpus.jsonl", 2, '{"_id": "d0", "text": "again"}',
     r"corpus\.jsonl, line 2: duplicate _id 'd0' \(first on line 1\)"),
    ("qrels/test.tsv", 3, "q23\tnope\t1", r"qrels/test\.tsv, line 3: corpus-id 'nope' is not in corpus\.jsonl"),
    ("qrels/test.tsv", 2, "q99\td22\t1", r"qrels/test\.tsv, line 2: query-id 'q99' is not in queries\.jsonl"),
    ("qrels/test.tsv", 4, "q24\td24\thigh", r"qrels/test\.tsv, line 4: score 'high' of query-id 'q24' is not an int"),
    ("qrels/test.tsv", 4, "q24 d24", r"qrels/test\.tsv, line 4: expected 3 tab-separated columns"),
    ("qrels/test.tsv", 1, "qid\tdocid\trel", r"qrels/test\.tsv, line 1: expected the header 'query-id<TAB>corpus-id"),
])
def test_malformed_folders_name_file_line_and_id(beir_dir: Path, file: str, line_no: int, text: str, message: str):
    _break(beir_dir, file, line_no, text)
    with pytest.raises(DataError, match=message):
        load_beir(beir_dir, "test")


@pytest.mark.parametrize("missing,message", [
    ("corpus.jsonl", r"scifake/corpus\.jsonl: file not found"),
    ("queries.jsonl", r"scifake/queries\.jsonl: file not found"),
    ("qrels/test.tsv", r"scifake/qrels/test\.tsv: file not found \(splits in .*scifake: dev, train\)"),
])
def test_missing_files_are_named(beir_dir: Path, missing: str, message: str):
    (beir_dir / missing).unlink()
    with pytest.raises(DataError, match=message):
        load_beir(beir_dir, "test")


def test_a_folder_that_does_not_exist_says_what_it_should_hold(tmp_path: Path):
    with pytest.raises(DataError, match=r"nowhere: not a BEIR folder .*corpus\.jsonl, queries\.jsonl"):
        load_beir(tmp_path / "nowhere")


def test_eval_specs_accept_folders_and_mappings_and_refuse_clashing_names(beir_dir: Path):
    specs = eval_set_specs([str(beir_dir), {"path": str(beir_dir), "split": "dev", "name": "sf_dev"}], "test")
    assert specs == [(str(beir_dir), "test", "scifake"), (str(beir_dir), "dev", "sf_dev")]
    with pytest.raises(ValueError, match="two sets are named scifake"):
        eval_set_specs([str(beir_dir), {"path": str(beir_dir), "split": "dev"}], "test")
    with pytest.raises(ValueError, match="unknown keys: folder"):
        eval_set_specs([{"folder": str(beir_dir)}], "test")


def test_eval_config_loads_each_named_set(make_cfg, beir_dir: Path, tokenizer):
    other = shutil.copytree(beir_dir, beir_dir.parent / "other")
    cfg = make_cfg([f"eval.beir=[{beir_dir},{{path: {other}, split: dev}}]"])
    sets = load_eval_sets(cfg, tokenizer)
    assert [(name, len(rs.queries)) for name, rs in sets] == [("scifake", 8), ("other", 6)]
    assert cfg.eval.batch_size == cfg.data.eval_batch_size and cfg.eval.max_length == cfg.data.max_length


def test_beir_as_training_data(make_cfg, tokenizer, beir_dir: Path):
    cfg = make_cfg(["data=beir", f"data.path={beir_dir}"])
    data = build_datamodule(cfg, tokenizer, "", "")
    assert isinstance(data.source, BeirRows)
    data.setup("fit")
    assert sorted(ex.query for ex in data.train_rows) == sorted(TOPICS[i][2] for i in SPLITS["train"])
    # validation: the dev split's queries over the whole corpus
    assert sorted(data.retrieval.queries) == sorted(TOPICS[i][2] for i in SPLITS["dev"])
    assert len(data.retrieval.corpus) == 36
    assert data.reports[0]["source"].endswith("qrels/train.tsv") and data.reports[0]["kept"] == 16


def test_beir_training_data_without_a_dev_split_holds_out_training_queries(tokenizer, beir_dir: Path):
    for split in ("dev", "test"):
        (beir_dir / "qrels" / f"{split}.tsv").unlink()
    data = data_module("beir", path=str(beir_dir), tokenizer=tokenizer, val_fraction=0.3, batch_size=4)
    data.setup("fit")
    held_out = set(data.retrieval.queries)
    assert held_out and not held_out & {ex.query for ex in data.train_rows}
    assert len(held_out) + len(data.train_rows) == 16


def test_beir_training_data_needs_its_train_split(tokenizer, beir_dir: Path):
    (beir_dir / "qrels" / "train.tsv").unlink()
    with pytest.raises(DataError, match=r"qrels/train\.tsv: file not found \(splits in .*: dev, test\)"):
        data_module("beir", path=str(beir_dir), tokenizer=tokenizer).setup("fit")


def test_numeric_ids_are_read_as_text(beir_dir: Path):
    rows = [json.loads(line) for line in (beir_dir / "corpus.jsonl").read_text().splitlines()]
    rows[22]["_id"] = 22
    (beir_dir / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (beir_dir / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\nq22\t22\t1\n")
    test = load_beir(beir_dir, "test")
    assert test.corpus_ids[next(iter(test.relevant[0]))] == "22"


def test_a_stored_corpus_gives_the_same_set_and_token_ids_and_is_built_once(beir_dir: Path, tokenizer,
                                                                           tmp_path: Path, monkeypatch):
    from gte_pro.data import corpus_store
    from gte_pro.data.corpus_store import load_beir_stored
    from gte_pro.data.datasets import EvalTexts

    builds: list[Path] = []
    build = corpus_store.build_corpus_store
    monkeypatch.setattr(corpus_store, "build_corpus_store", lambda *a, **k: builds.append(a[2]) or build(*a, **k))
    monkeypatch.setattr(corpus_store, "CHUNK", 5)  # several chunks for 36 documents
    cache = tmp_path / "cache"
    stored = load_beir_stored(beir_dir, "test", None, tokenizer, 24, "passage: ", cache)
    memory = load_beir(beir_dir, "test")
    assert (stored.queries, stored.relevant, stored.query_ids) == (memory.queries, memory.relevant, memory.query_ids)
    assert len(stored.corpus) == 36
    with pytest.raises(TypeError, match="token ids on disk"):
        stored.corpus[0]
    expected = EvalTexts(memory, tokenizer, 24, "query: ", "passage: ")
    ours = EvalTexts(stored, tokenizer, 24, "query: ", "passage: ")
    assert ours.order.tolist() == expected.order.tolist()
    for i in range(len(ours)):
        assert ours[i][0] == expected[i][0] and ours[i][1].tolist() == expected[i][1].tolist()
    with pytest.raises(ValueError, match="tokenized with max_length=24"):
        EvalTexts(stored, tokenizer, 32, "query: ", "passage: ")
    # a second load reuses the store; a changed corpus (or max_length) builds a new one
    load_beir_stored(beir_dir, "dev", None, tokenizer, 24, "passage: ", cache)
    assert len(builds) == 1
    with open(beir_dir / "corpus.jsonl", "a") as corpus:
        corpus.write(json.dumps({"_id": "new", "text": "one more document"}) + "\n")
    assert len(load_beir_stored(beir_dir, "test", None, tokenizer, 24, "passage: ", cache).corpus) == 37
    assert len(builds) == 2 and builds[0] != builds[1]


def test_a_stored_corpus_reports_duplicate_ids_and_unknown_qrels_ids_by_line(beir_dir: Path, tokenizer,
                                                                            tmp_path: Path):
    from gte_pro.data.corpus_store import load_beir_stored

    lines = (beir_dir / "corpus.jsonl").read_text().splitlines()
    (beir_dir / "corpus.jsonl").write_text("\n".join([*lines, lines[2]]) + "\n")
    with pytest.raises(DataError, match=r"corpus\.jsonl, line 37: duplicate _id 'd2' \(first on line 3\)"):
        load_beir_stored(beir_dir, "test", None, tokenizer, 24, "", tmp_path / "c1")
    (beir_dir / "corpus.jsonl").write_text("\n".join(lines[:22] + lines[23:]) + "\n")  # d22 is gone; test judges it
    qrels = (beir_dir / "qrels" / "test.tsv").read_text().splitlines()
    line = next(n for n, row in enumerate(qrels, 1) if row.split("\t")[1] == "d22")
    with pytest.raises(DataError, match=rf"test\.tsv, line {line}: corpus-id 'd22' is not in corpus\.jsonl"):
        load_beir_stored(beir_dir, "test", None, tokenizer, 24, "", tmp_path / "c2")
