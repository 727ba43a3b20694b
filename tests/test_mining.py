"""Hard-negative mining (gte_pro.mining): the selection against a brute-force reference, chunking, sharding over 2
gloo processes (rescoring with a teacher too: tests/test_mine_rescore.py has the rest of it), ``mode=mine`` end to
end (1 process and ``strategy=ddp devices=2``), and bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_mining_options
from gte_pro.data.records import MAX_TEXT_CHARS, Example, clean_text
from gte_pro.errors import DataError
from gte_pro.mining import corpus as corpus_module
from gte_pro.mining.core import mine_negatives, unit_rows
from gte_pro.mining.corpus import open_text_store, read_corpus_file
from gte_pro.mining.embed import mine_texts
from gte_pro.mining.options import MiningOptions
from gte_pro.mining.problem import build_problem
from gte_pro.mining.rescore import rescore_window, window_options
from gte_pro.modes.build_data import data_module
from tests.conftest import REPO, free_port, write_jsonl
from tests.ddp_harness import spawn_ranks

# the 2-process test's workers import this module: Lightning and Hydra (gte_pro.train) are imported where used

NUM_QUERIES, NUM_CORPUS, DIM = 30, 240, 12
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def _problem(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, list[list[int]]]:
    """Documents in 12 tight clusters (many candidates score near the positive, so margins bite), queries near one
    of their two positives, and exact duplicate documents on both sides of any split (ties broken by id)."""
    gen = torch.Generator().manual_seed(seed)
    centers = torch.randn(12, DIM, generator=gen)
    corpus = centers[torch.arange(NUM_CORPUS) % 12] + 0.35 * torch.randn(NUM_CORPUS, DIM, generator=gen)
    corpus[200], corpus[201], corpus[7] = corpus[5], corpus[5], corpus[5]
    positives = [[(8 * i) % NUM_CORPUS, (8 * i + 13) % NUM_CORPUS] for i in range(NUM_QUERIES)]
    queries = corpus[[p[0] for p in positives]] + 0.3 * torch.randn(NUM_QUERIES, DIM, generator=gen)
    queries[3] = corpus[5]  # ties at the top: 5, 7, 200, 201 score the same
    positives[4] = []  # a query without positives: no margin applies
    return queries, corpus, positives


def _brute_force(queries: torch.Tensor, corpus: torch.Tensor, positives: list[list[int]],
                 options: MiningOptions) -> tuple[list[list[int]], list[list[int]]]:
    """(chosen ids, all window survivors) per query from the full score matrix, sorted by (score desc, id asc)."""
    scores = (unit_rows(queries)[:, None, :] * unit_rows(corpus)[None, :, :]).sum(-1)  # one sum per pair
    chosen, survivors = [], []
    for q, row in enumerate(scores):
        ranked = sorted(range(len(row)), key=lambda j: (-float(row[j]), j))
        window = [j for j in ranked if j not in positives[q]][options.range_min : options.range_max]
        pos = row[positives[q]].min() if positives[q] else torch.tensor(math.nan)
        limits = [pos - pos.abs() * options.relative_margin] if options.relative_margin is not None else []
        limits += [pos - options.absolute_margin] if options.absolute_margin is not None else []
        limits += [torch.tensor(options.max_score)] if options.max_score is not None else []
        kept = [j for j in window if not any(row[j] > limit for limit in limits)]
        survivors.append(kept)
        chosen.append(kept[: options.num_negatives])
    return chosen, survivors


def _mine(queries, corpus, positives, options):
    return mine_negatives(queries, corpus, torch.arange(len(corpus)), len(corpus), positives, options)


def _ids(mined) -> list[list[int]]:
    return [[i for i in row if i >= 0] for row in mined.indices.tolist()]


@pytest.mark.parametrize("margins", [
    {"relative_margin": 0.05}, {"relative_margin": None, "absolute_margin": 0.02},
    {"relative_margin": None, "max_score": 0.5}, {"relative_margin": None}],
    ids=["relative", "absolute", "max", "none"])
def test_top_sampling_equals_the_brute_force_window_and_margins(margins):
    queries, corpus, positives = _problem()
    options = default_mining_options(num_negatives=6, range_min=3, range_max=40, **margins)
    mined = _mine(queries, corpus, positives, options)
    chosen, survivors = _brute_force(queries, corpus, positives, options)
    assert _ids(mined) == chosen
    if margins.get("relative_margin") or margins.get("absolute_margin") or margins.get("max_score"):
        # the margin removed candidates (and left some rows short): the comparison above is not vacuous
        assert mined.dropped_false_negatives == sum(37 - len(s) for s in survivors) > 0
        assert mined.short_rows == sum(len(s) < 6 for s in survivors) > 0
    else:
        assert mined.dropped_false_negatives == 0 and mined.short_rows == 0
    padded = mined.indices < 0
    assert torch.isnan(mined.scores[padded]).all() and not torch.isnan(mined.scores[~padded]).any()
    assert torch.all(mined.scores[:, :-1].nan_to_num(-9) >= mined.scores[:, 1:].nan_to_num(-9))  # best first
    assert math.isnan(mined.positive_scores[4]) and not torch.isnan(mined.positive_scores[:4]).any()


def _store(files, tokenizer, tmp_path: Path, max_length: int = 32, prefix: str = ""):
    return open_text_store(files, tokenizer, max_length, prefix, tmp_path / "cache")


def test_positives_and_their_duplicates_are_never_returned(tmp_path: Path, tokenizer):
    # a corpus file repeats a positive (other whitespace: the same text once cleaned) and a query repeats over rows
    rows = [Example(f"question number {i}", [f"answer text number {i}"]) for i in range(20)]
    rows.append(Example("question number 0", ["another answer to question 0"]))
    corpus_file = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "  answer   text number 3 "},
                                                          {"title": "Extra", "text": "an extra document"}])
    problem = build_problem(rows, _store([corpus_file], tokenizer, tmp_path))
    assert len(problem.corpus) == 22 and problem.corpus[-1] == "Extra an extra document"
    assert problem.counts["corpus-file texts already in the corpus"] == 1
    assert len(problem.queries) == 20 and problem.positives[0] == [0, 20]
    # each query embedded as its first positive: positives rank first and must still never come back
    gen = torch.Generator().manual_seed(1)
    corpus = torch.randn(len(problem.corpus), 8, generator=gen)
    queries = corpus[[p[0] for p in problem.positives]].clone()
    queries[0] = corpus[20] + corpus[0]
    mined = _mine(queries, corpus, problem.positives, default_mining_options(num_negatives=5, range_min=0, range_max=10,
                                                                    relative_margin=None))
    for q, row in enumerate(_ids(mined)):
        assert len(row) == 5 and not set(row) & set(problem.positives[q])


def _in_memory_corpus(rows: list[Example], files: list[Path], min_doc_chars: int) -> tuple[list[str], Counter]:
    """The corpus and counts as mining built them before the store: every file text read into a dict, in order."""
    corpus = list(dict.fromkeys(p for row in rows for p in row.positives))
    ids, counts = {text: i for i, text in enumerate(corpus)}, Counter()
    for path in files:
        for raw in read_corpus_file(path):
            text = clean_text(raw[:MAX_TEXT_CHARS])
            if len(text) < max(min_doc_chars, 1):
                counts[f"corpus-file texts shorter than {max(min_doc_chars, 1)} chars left out"] += 1
            elif text in ids:
                counts["corpus-file texts already in the corpus"] += 1
            else:
                ids[text] = len(corpus)
                corpus.append(text)
                counts["corpus-file texts added"] += 1
    return corpus, counts


@pytest.mark.parametrize("collide", [False, True], ids=["hashes", "every-hash-collides"])
def test_the_store_gives_the_corpus_and_counts_of_reading_every_text(tmp_path: Path, tokenizer, monkeypatch,
                                                                     collide):
    if collide:  # 3 hash values for all texts: only a comparison of the texts can tell them apart
        monkeypatch.setattr(corpus_module, "hash64", lambda text: len(text) % 3)
    rows = [Example(f"q {i}", [f"positive text {i % 7}", f"shared answer {i % 3}"]) for i in range(12)]
    docs = ([{"text": f"document {j % 8} about \u00e9t\u00e9 {j % 4}"} for j in range(30)]
            + [{"text": "positive   text 2"}, {"text": "ok"}, {"text": " \u200b "}, {"title": "T", "text": "t"}])
    first = write_jsonl(tmp_path / "a.jsonl", docs[:20])
    second = write_jsonl(tmp_path / "b.jsonl", docs[20:] + docs[:5])  # repeats across the two files
    store = _store([first, second], tokenizer, tmp_path)
    assert store.meta["lines"] == 39 and store.meta["lines_per_file"] == [20, 19]
    for min_doc_chars in (0, 5):
        problem = build_problem(rows, store, min_doc_chars)
        corpus, counts = _in_memory_corpus(rows, [first, second], min_doc_chars)
        assert list(problem.corpus) == corpus and +problem.counts - Counter({
            "corpus from training positives": 10}) == counts
        assert len(problem.corpus.texts) == 10  # only the positives are held; the file texts stay on disk
    assert counts["corpus-file texts added"] == 8 and counts["corpus-file texts already in the corpus"] == 28


def test_the_stores_token_ids_mine_what_tokenizing_the_texts_mines(tmp_path: Path, tokenizer):
    queries, texts, positives = _texts()
    texts = [clean_text(text) for text in texts]  # as training texts are: the files' copies are the positives
    rows = [Example(q, [texts[p[0]]]) for q, p in zip(queries, positives, strict=True)]
    extra = write_jsonl(tmp_path / "extra.jsonl", [{"text": t} for t in texts] + [{"text": texts[3]}])
    encoder = _tiny_encoder(doc_prefix="passage: ")
    problem = build_problem(rows, _store([extra], tokenizer, tmp_path, 24, "passage: "))
    assert len(problem.corpus) == len(texts)
    options = default_mining_options(4, 0, 20, relative_margin=None)
    stored = mine_texts(encoder, problem.queries, problem.corpus, problem.positives, options, 4, 24)
    in_memory = mine_texts(encoder, problem.queries, list(problem.corpus), problem.positives, options, 4, 24)
    assert torch.equal(stored.indices, in_memory.indices) and stored.indices.min() >= 0
    assert torch.equal(stored.scores, in_memory.scores)
    with pytest.raises(ValueError, match=r"tokenized with max_length=24, doc prefix 'passage: '; this mining uses 32"):
        mine_texts(encoder, problem.queries, problem.corpus, problem.positives, options, 4, 32)


def test_a_store_is_built_once_and_again_when_its_file_changes(tmp_path: Path, tokenizer, monkeypatch):
    path = write_jsonl(tmp_path / "corpus.jsonl", [{"text": "one document"}, {"text": "another one"}])
    folder = _store([path], tokenizer, tmp_path).folder
    monkeypatch.setattr(corpus_module, "build_text_store", lambda *a, **k: pytest.fail("rebuilt an unchanged store"))
    assert _store([path], tokenizer, tmp_path).folder == folder
    monkeypatch.undo()
    write_jsonl(path, [{"text": "one document"}, {"text": "another one"}, {"text": "a third one"}])
    changed = _store([path], tokenizer, tmp_path)
    assert changed.folder != folder and changed.meta["lines"] == 3 and changed.text(2) == "a third one"


@pytest.mark.parametrize("sampling", ["top", "random"])
def test_chunked_search_equals_one_block(sampling):
    queries, corpus, positives = _problem()
    options = default_mining_options(num_negatives=5, range_min=2, range_max=30, sampling=sampling)
    whole = _mine(queries, corpus, positives, replace(options, max_scores_per_chunk=1 << 30))
    chunked = _mine(queries, corpus, positives, replace(options, max_scores_per_chunk=50))  # < 1 query x corpus
    assert torch.equal(whole.indices, chunked.indices)
    assert torch.equal(whole.scores.nan_to_num(), chunked.scores.nan_to_num())
    assert whole.dropped_false_negatives == chunked.dropped_false_negatives
    _, survivors = _brute_force(queries, corpus, positives, options)
    for row, allowed in zip(_ids(whole), survivors, strict=True):
        assert set(row) <= set(allowed) and len(row) == min(5, len(allowed))
    if sampling == "random":  # a real draw: not the top ones, and another seed draws others
        assert _ids(whole) != _brute_force(queries, corpus, positives, options)[0]
        assert not torch.equal(_mine(queries, corpus, positives, replace(options, seed=1)).indices, whole.indices)


def _texts() -> tuple[list[str], list[str], list[list[int]]]:
    queries = [f"question {i} about subject {i * 7}" + " more" * (i % 5) for i in range(14)]
    corpus = [f"passage {j} on subject {j * 3}, " + "with some words " * (j % 6) for j in range(45)]
    return queries, corpus, [[i, i + 20] for i in range(14)]


def _tiny_encoder(**kwargs):
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)  # identical weights in every process
    # one padded pass: the tests compare ranks with one process bit for bit, and a text's length chunk (hence its
    # padding and float rounding) depends on the batch it is in
    kwargs.setdefault("length_chunks", 1)
    return Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=32, **kwargs)


# a tiny random cross-encoder whose logits spread over a few units (the default initializer_range gives ~equal ones)
TEACHER = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64,
           "initializer_range": 0.5}
RESCORE = default_mining_options(4, 0, 20, relative_margin=None, absolute_margin=0.1)


def tiny_teacher():
    from gte_pro.models.cross_encoder import CrossEncoder
    from gte_pro.models.teacher import CrossEncoderTeacher

    torch.manual_seed(0)  # identical weights in every process
    return CrossEncoderTeacher(CrossEncoder.load(packaged_minilm_path(), max_length=64, random_init_config=TEACHER,
                                                 length_chunks=1))


def _rescored():
    """The texts' window mined by the tiny encoder, judged by the tiny teacher (batches of 8 pairs dealt over the
    ranks of the process group, if there is one)."""
    texts = _texts()
    window = mine_texts(_tiny_encoder(), *texts, window_options(RESCORE), batch_size=4, max_length=32)
    return rescore_window(tiny_teacher(), *texts, window, RESCORE, batch_size=8)[0]


SHARDED = {"top": default_mining_options(5, 2, 30), "random": default_mining_options(5, 2, 30, sampling="random"),
           "ties": default_mining_options(5, 0, 30, relative_margin=None)}


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        queries, corpus, positives = _problem()
        # uneven, interleaved shards: rank 0 holds every third document
        index = torch.tensor([j for j in range(NUM_CORPUS) if (j % 3 == 0) == (rank == 0)])
        results = {name: mine_negatives(queries, corpus[index], index, NUM_CORPUS, positives, options)
                   for name, options in SHARDED.items()}
        texts = _texts()
        # each rank embeds its share: the ranks are the process group's (gte_pro.utils.distributed.world())
        results["texts"] = mine_texts(_tiny_encoder(), *texts, default_mining_options(5, 0, 20, relative_margin=None),
                                      batch_size=4, max_length=32)
        results["rescored"] = _rescored()
        torch.save({name: vars(r) for name, r in results.items()}, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_two_gloo_processes_mine_exactly_what_one_does(tmp_path: Path):
    spawn_ranks(_worker, (2, free_port(), str(tmp_path)), tmp_path)
    queries, corpus, positives = _problem()
    expected = {name: vars(_mine(queries, corpus, positives, options)) for name, options in SHARDED.items()}
    options = default_mining_options(5, 0, 20, relative_margin=None)
    expected["texts"] = vars(mine_texts(_tiny_encoder(), *_texts(), options, batch_size=4, max_length=32))
    expected["rescored"] = vars(_rescored())
    assert expected["rescored"]["dropped_false_negatives"] > 0 and (expected["rescored"]["indices"] >= 0).sum() > 20
    # query 3 is document 5, whose copies 7, 200 and 201 tie with it (on both ranks): lower ids first
    assert expected["ties"]["indices"][3, :4].tolist() == [5, 7, 200, 201]
    for rank in range(2):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        for name, want in expected.items():
            for key, value in want.items():
                if isinstance(value, torch.Tensor):
                    assert torch.equal(got[name][key].nan_to_num(), value.nan_to_num()), (rank, name, key)
                else:
                    assert got[name][key] == value, (rank, name, key)
    assert expected["texts"]["indices"].min() >= 0  # every query got its 5 negatives: a non-trivial comparison


def _mine_overrides(pairs_file: Path, corpus_file: Path) -> list[str]:
    return ["mode=mine", "model=tiny", "data=jsonl", f"data.train_file={pairs_file}", "data.eval_batch_size=8",
            f"mine.corpus_files=[{corpus_file}]", "mine.num_negatives=4", "mine.range_min=1", "mine.range_max=30",
            "mine.relative_margin=null"]


@pytest.fixture
def corpus_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", [{"_id": str(i), "title": f"Note {i}",
                                                    "text": f"Extra document {i} about subject {i % 9}."}
                                                   for i in range(40)])


def test_mode_mine_writes_a_file_that_trains_and_a_report(make_cfg, pairs_file: Path, corpus_file: Path,
                                                          tmp_path: Path, tokenizer, capsys):
    from gte_pro.train import train

    run = tmp_path / "mine"
    assert train(make_cfg(_mine_overrides(pairs_file, corpus_file), output_dir=run)) is None
    lines = [json.loads(line) for line in (run / "mined.jsonl").read_text().splitlines()]
    report = json.loads((run / "mine_report.json").read_text())
    rows, held_out = lines[: report["rows"]], lines[report["rows"] :]
    assert report["rows"] > 40 and report["corpus_size"] == report["rows"] + 40
    # the rows data.val_fraction held out come back unchanged, so that training on the file holds them out again
    assert len(held_out) == report["held_out_rows_copied"] > 0 and all(r["negatives"][0].startswith("Unrelated")
                                                                        for r in held_out)
    assert report["negatives_per_row"] == {"mean": 4.0, "min": 4} and report["rows_short_of_num_negatives"] == 0
    for row in rows:  # the rows' own negatives ("Unrelated passage ...") are replaced by mined ones
        assert len(row["negatives"]) == 4 and not set(row["negatives"]) & set(row["positive"])
        assert not any(n.startswith("Unrelated") for n in row["negatives"])
    assert (run / "mine_scores.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "rows short of num_negatives | 0" in (run / "mine_report.md").read_text()
    out = capsys.readouterr().out
    assert f"mined:   {run / 'mined.jsonl'}" in out
    assert f"data.train_file={run / 'mined.jsonl'} data.num_negatives=4 data.val_fraction=0.05" in out
    data = data_module("jsonl", train_file=str(run / "mined.jsonl"), tokenizer=tokenizer, num_negatives=4,
                       cache_dir=str(tmp_path / "cache"))
    data.prepare_data()
    data.setup()
    assert [(ex.query, ex.negatives) for ex in data.train_rows] == [(r["query"], r["negatives"]) for r in rows]
    assert data.retrieval.queries == [r["query"] for r in held_out]


@pytest.mark.slow
def test_ddp_two_processes_write_the_one_process_file(make_cfg, pairs_file: Path, corpus_file: Path, tmp_path: Path,
                                                      cache_dir: Path):
    from gte_pro.train import train

    overrides = _mine_overrides(pairs_file, corpus_file)
    train(make_cfg(overrides, output_dir=tmp_path / "one"))
    cmd = [sys.executable, "train.py", *overrides, "strategy=ddp", "devices=2", f"hydra.run.dir={tmp_path / 'two'}",
           f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert json.loads((tmp_path / "two" / "mine_report.json").read_text())["world_size"] == 2
    assert (tmp_path / "two" / "mined.jsonl").read_bytes() == (tmp_path / "one" / "mined.jsonl").read_bytes()


def test_only_validation_rows_split_off_by_the_hash_are_copied():
    from types import SimpleNamespace

    from gte_pro.data.split import is_held_out
    from gte_pro.mining.problem import hash_held_out_rows

    queries = [f"query {i}" for i in range(400)]
    split = [Example(q, ["a positive text"]) for q in queries if is_held_out(q, 0.1)]
    other = [Example(q, ["a positive text"]) for q in queries[:30]]  # a separate validation file's rows

    def source(val, **extra):
        cache = SimpleNamespace(validation=lambda: (val, []))
        return SimpleNamespace(token_cache=cache, val_fraction=0.1, **extra)

    assert len(split) > 10 and hash_held_out_rows(source(split)) == split
    assert hash_held_out_rows(source(other)) == []  # copied, most would become training rows
    assert hash_held_out_rows(source(split, val_file="dev.jsonl")) == []


# --- bad input -----------------------------------------------------------------------------------------------------
def test_bad_corpus_files_name_the_file_line_and_field(tmp_path: Path, tokenizer):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    with pytest.raises(DataError, match=f"{empty}: no JSON lines"):
        _store([empty], tokenizer, tmp_path)
    no_text = write_jsonl(tmp_path / "no_text.jsonl", [{"text": "fine document"}, {"_id": "7", "title": "t"}])
    with pytest.raises(DataError, match=f"{no_text}, line 2: field 'text' is missing"):
        _store([no_text], tokenizer, tmp_path)
    bad_title = write_jsonl(tmp_path / "bad_title.jsonl", [{"text": "fine", "title": 3}])
    with pytest.raises(DataError, match=f"{bad_title}, line 1: field 'title' must be a string, got int"):
        _store([bad_title], tokenizer, tmp_path)
    with pytest.raises(DataError, match=f"mine.corpus_files: {tmp_path / 'missing.jsonl'}: file not found"):
        _store([tmp_path / "missing.jsonl"], tokenizer, tmp_path)
    assert not list((tmp_path / "cache" / "mining_corpora").iterdir())  # no store, and no half-built folder left
    with pytest.raises(DataError, match="no training rows"):
        build_problem([])


@pytest.mark.parametrize(("values", "message"), [
    ({"range_min": 5, "range_max": 5}, "mine.range_min=5: must be smaller than mine.range_max=5"),
    ({"sampling": "best"}, "mine.sampling='best': valid choices: top, random"),
    ({"relative_margin": -0.1}, "mine.relative_margin=-0.1: expected a number >= 0 or null"),
    ({"num_negatives": 0}, "mine.num_negatives=0: expected an integer >= 1"),
    ({"num_negatives": 20, "range_min": 0, "range_max": 10}, "mine.num_negatives=20: more than the window holds")])
def test_invalid_options_name_the_key(make_cfg, values, message):
    """The options are checked once, with the config (MineSchema's rules and the window rule), before any run."""
    from gte_pro.config.checks import config_problems

    problems = config_problems(make_cfg([f"mine.{key}={value}" for key, value in values.items()]))
    assert any(problem.startswith(message) for problem in problems), problems


def test_invalid_options_in_the_config_name_the_key(make_cfg):
    from gte_pro.errors import ConfigError
    from gte_pro.train import train

    with pytest.raises(ConfigError, match="mine.sampling='best': valid choices: top, random"):
        train(make_cfg(["mode=mine", "mine.sampling=best"]))
    with pytest.raises(ConfigError, match="mine.range_min=100: must be smaller than mine.range_max=100"):
        train(make_cfg(["mode=mine", "model=tiny", "mine.range_min=100"]))


def test_empty_corpus_and_mismatched_dimensions_are_errors():
    queries, corpus, _ = _problem()
    with pytest.raises(ValueError, match="the corpus is empty"):
        mine_negatives(queries, corpus[:0], torch.arange(0), 0, [[] for _ in queries], default_mining_options())
    with pytest.raises(ValueError, match=r"query embeddings \(30, 12\) and corpus embeddings \(240, 6\) do not match"):
        _mine(queries, corpus[:, :6], [[] for _ in queries], default_mining_options())
