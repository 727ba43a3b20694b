"""Mining with a teacher (``mode=mine mine.rescore_with=<teacher>``, gte_pro.mining.rescore): the teacher's
selection on hand-made scores, ``mode=mine`` end to end with a tiny cross-encoder (a candidate the teacher puts above
the positive is dropped and counted, the written scores are the teacher's, the file trains with
``loss=distill_kl``), and bad settings. 1 vs 2 ranks: tests/test_mining.py's gloo test."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path

import pytest
import torch

from gte_pro.config.defaults import default_mining_options
from gte_pro.errors import ConfigError
from gte_pro.mining.options import rescore_options
from gte_pro.mining.rescore import select_rescored
from gte_pro.models.teacher import CrossEncoderTeacher, load_teacher
from tests.conftest import write_jsonl
from tests.test_mining import tiny_teacher

NAN = math.nan


# --- the selection -------------------------------------------------------------------------------------------------
def test_candidates_at_or_above_the_positive_are_dropped_and_the_rest_kept_by_teacher_score():
    ids = torch.tensor([[5, 6, 7, 8, 9, -1], [1, 2, 3, 4, 5, 6]])
    scores = torch.tensor([[0.2, 0.9, 0.5, 0.1, 0.3, NAN], [3.0, -1.0, 2.0, 0.5, 2.0, 1.0]])
    positive = torch.tensor([0.5, NAN])  # the second query has no positive: nothing is dropped
    options = default_mining_options(3, 0, 6, relative_margin=None)
    out, out_scores, dropped = select_rescored(ids, scores, positive, options)
    # 6 scores above the positive, 7 equals it: both dropped; the rest best first by the teacher, not the embedder
    assert out.tolist() == [[9, 5, 8], [1, 3, 5]] and dropped.tolist() == [2, 0]
    assert torch.equal(out_scores, torch.tensor([[0.3, 0.2, 0.1], [3.0, 2.0, 2.0]]))  # equal: embedder rank first
    # the margins apply to the teacher's scores: above 0.5 - 0.25 goes too
    margin = default_mining_options(3, 0, 6, relative_margin=None, absolute_margin=0.25)
    out, out_scores, dropped = select_rescored(ids, scores, positive, margin)
    assert out[0].tolist() == [5, 8, -1] and math.isnan(out_scores[0, 2]) and dropped.tolist() == [3, 0]
    out, _, dropped = select_rescored(ids, scores, positive, default_mining_options(3, 0, 6, relative_margin=None,
                                                                           max_score=1.5))
    assert out[1].tolist() == [6, 4, 2] and dropped.tolist() == [2, 3]


def test_random_sampling_draws_among_the_teachers_survivors():
    gen = torch.Generator().manual_seed(0)
    ids = torch.arange(40 * 30).reshape(40, 30)
    scores = torch.randn(40, 30, generator=gen)
    positive = torch.randn(40, generator=gen)
    draws = [select_rescored(ids, scores, positive, default_mining_options(4, 0, 30, sampling="random",
                                                                          relative_margin=None, seed=seed),
                             first_row=7) for seed in (0, 1)]
    top, _, _ = select_rescored(ids, scores, positive, default_mining_options(4, 0, 30, relative_margin=None))
    for out, out_scores, _ in draws:
        kept = out >= 0
        assert (out_scores[kept] < positive[:, None].expand_as(out)[kept]).all()
        assert torch.all(out_scores[:, :-1].nan_to_num(-9) >= out_scores[:, 1:].nan_to_num(-9))  # best first
        assert kept.sum(1).tolist() == (scores < positive[:, None]).sum(1).clamp(max=4).tolist()
    assert not torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[0][0], top)


class TableTeacher:
    """A teacher whose scores are a pure function of the pair: what it judges is known exactly."""

    kind, name_or_path = "cross-encoder", "table"

    def __init__(self, table: dict[tuple[str, str], float]) -> None:
        self.table, self.calls = table, []

    def score(self, queries, docs, batch_size=64):
        self.calls.append(len(queries))
        return torch.tensor([self.table.get((q, d), -((int(q[1:]) * 7 + int(d[1:]) * 13) % 29 + 1) / 8)
                             for q, d in zip(queries, docs, strict=True)])

    def to(self, device):
        return self


def test_rescore_window_judges_with_the_teachers_scores():
    from gte_pro.data.records import Example
    from gte_pro.mining.core import MinedNegatives
    from gte_pro.mining.rescore import rescore_window

    queries, corpus = [f"q{i}" for i in range(6)], [f"d{j}" for j in range(30)]
    positives = [[q, q + 10] for q in range(6)]
    positives[2] = [2, 12, 22]
    table = {(f"q{q}", f"d{p}"): 1.0 - 0.25 * k for q, ids in enumerate(positives) for k, p in enumerate(ids)}
    table |= {("q0", "d25"): 5.0, ("q0", "d26"): 0.75, ("q3", "d9"): 0.6, ("q9", "d1"): 2.0}  # q0's bar: 0.75
    teacher = TableTeacher(table)
    # the embedder's window: 20 non-positives a query in id order (ids 25 and 26 in q0's)
    ids = torch.tensor([[j for j in range(8, 30) if j not in p][:20] for p in positives])
    window = MinedNegatives(ids, torch.zeros(ids.shape), torch.zeros(6), 0, 0)
    options = default_mining_options(4, 0, 20, relative_margin=None, absolute_margin=0.3)
    held_out = [Example("q9", ["d1"], ["d2", "d3"])]
    mined, rescored = rescore_window(teacher, queries, corpus, positives, window, options, 7, held_out=held_out)
    assert teacher.calls == [7] * 19 + [3]  # 13 positives + 120 candidates + 3 held-out texts, 7 pairs a call
    assert rescored.positive_scores == [[1.0, 0.75]] * 2 + [[1.0, 0.75, 0.5]] + [[1.0, 0.75]] * 3
    assert mined.positive_scores.tolist() == [0.75, 0.75, 0.5, 0.75, 0.75, 0.75]
    for q, row in enumerate(ids.tolist()):
        scores = teacher.score([f"q{q}"] * len(row), [f"d{j}" for j in row]).tolist()
        bar = mined.positive_scores[q].item()
        # kept: the top 4 of those below bar - 0.3, equal scores in window order; dropped: the rest above that
        survivors = sorted((-s, k) for k, s in enumerate(scores) if s < bar and not s > bar - 0.3)
        assert mined.indices[q].tolist() == [row[k] for _, k in survivors[:4]]
        assert mined.scores[q].tolist() == [-s for s, _ in survivors[:4]]
        assert rescored.dropped_per_query[q] == len(row) - len(survivors)
    assert 25 not in mined.indices[0] and 26 not in mined.indices[0] and rescored.dropped_per_query[0] == 2
    assert 9 not in mined.indices[3] and rescored.dropped_per_query[3] == 1  # 0.6 > 0.75 - 0.3: the margin's
    assert rescored.dropped_per_query[1:].sum() == 1 and mined.dropped_false_negatives == 3
    assert rescored.held_out_scores == [([2.0], teacher.score(["q9"] * 2, ["d2", "d3"]).tolist())]
    assert rescored.pairs == 136 and rescored.judged_per_query.tolist() == [20] * 6


# --- mode=mine end to end -------------------------------------------------------------------------------------------
BOOSTED = "Extra document 7 about subject 7."  # the teacher's favourite: above every positive


@pytest.fixture
def teacher_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "teacher"
    tiny_teacher().model.save(folder)
    return folder


@pytest.fixture
def boosted(monkeypatch):
    """Every cross-encoder teacher scores BOOSTED 100 logits higher than its weights say."""
    score = CrossEncoderTeacher.score

    def boost(self, queries, docs, batch_size=64):
        return score(self, queries, docs, batch_size) + 100.0 * torch.tensor([d == BOOSTED for d in docs])

    monkeypatch.setattr(CrossEncoderTeacher, "score", boost)


def _files(tmp_path: Path) -> tuple[Path, Path]:
    rows = [{"query": f"what is topic number {i}?", "positive": f"Topic {i} is a subject that covers item {i}.",
             "negatives": [f"Unrelated passage {i} about the weather."]} for i in range(24)]
    rows[3]["positive"] = [rows[3]["positive"], "A second positive of topic 3, about item 3."]
    corpus = [{"text": f"Extra document {i} about subject {i % 9}."} for i in range(16)]
    return write_jsonl(tmp_path / "pairs.jsonl", rows), write_jsonl(tmp_path / "corpus.jsonl", corpus)


def _mine_overrides(tmp_path: Path, teacher: Path) -> list[str]:
    pairs, corpus = _files(tmp_path)
    return ["mode=mine", "model=tiny", "data=jsonl", f"data.train_file={pairs}", "data.val_fraction=0.1",
            f"mine.corpus_files=[{corpus}]", "mine.num_negatives=3", "mine.range_min=0", "mine.range_max=100",
            "mine.relative_margin=null", f"mine.rescore_with={teacher}", "mine.rescore_batch_size=16"]


def test_mode_mine_with_a_teacher_drops_what_it_puts_above_the_positive_and_writes_its_scores(
        make_cfg, tmp_path: Path, teacher_folder: Path, boosted, capsys):
    from gte_pro.train import train

    run = tmp_path / "mine"
    train(make_cfg(_mine_overrides(tmp_path, teacher_folder), output_dir=run))
    report = json.loads((run / "mine_report.json").read_text())
    lines = [json.loads(line) for line in (run / "mined.jsonl").read_text().splitlines()]
    rows, held_out = lines[: report["rows"]], lines[report["rows"] :]
    assert held_out and all(r["negatives"] == [f"Unrelated passage {r['query'].split()[-1][:-1]} about the weather."]
                            for r in held_out)  # validation rows: their own texts, with the teacher's scores
    corpus = list(dict.fromkeys([p for r in rows for p in r["positive"]]
                                + [f"Extra document {i} about subject {i % 9}." for i in range(16)]))
    assert len(corpus) == report["corpus_size"] == len(rows) + 1 + 16
    teacher = load_teacher(str(teacher_folder))  # the same weights, read back; scores boosted as in the run
    # the tiny teacher puts some candidates within 1e-6 of each other, where the batch a pair was scored in can
    # flip an order: the judgement is checked exactly in test_rescore_window_judges_with_the_teachers_scores, and
    # here up to such near-ties
    tie, dropped_at_least, dropped_at_most, margins = 1e-5, 0, 0, []
    for row in rows:
        # the window is every non-positive document: recompute the teacher's judgement of all of them
        candidates = [d for d in corpus if d not in row["positive"]]
        judged = dict(zip(candidates, teacher.score([row["query"]] * len(candidates), candidates).tolist(),
                          strict=True))
        positive = teacher.score([row["query"]] * len(row["positive"]), row["positive"])
        bar = float(positive.min())  # the lowest positive
        dropped_at_least += sum(s >= bar + tie for s in judged.values())
        dropped_at_most += sum(s >= bar - tie for s in judged.values())
        margins.append(bar - max(judged.values()))
        assert judged[BOOSTED] > bar and BOOSTED not in row["negatives"] and len(row["negatives"]) == 3
        kept = [judged[d] for d in row["negatives"]]
        assert max(kept) < bar + tie and kept == sorted(kept, reverse=True)  # below the positive, best first
        assert all(s <= kept[-1] + tie for d, s in judged.items() if d not in row["negatives"] and s < bar - tie)
        torch.testing.assert_close(torch.tensor(row["pos_scores"]), positive, atol=1e-6, rtol=1e-6)
        torch.testing.assert_close(torch.tensor(row["neg_scores"]), torch.tensor(kept), atol=1e-6, rtol=1e-6)
    for row in held_out:
        texts = row["positive"] + row["negatives"]
        torch.testing.assert_close(torch.tensor(row["pos_scores"] + row["neg_scores"]),
                                   teacher.score([row["query"]] * len(texts), texts), atol=1e-6, rtol=1e-6)
    rescore = report["rescore"]
    assert report["dropped_false_negatives"] == rescore["dropped"] and dropped_at_least <= rescore["dropped"]
    assert rescore["dropped"] <= dropped_at_most and rescore["dropped_per_query"]["min"] >= 1  # BOOSTED at least
    assert rescore["candidates_judged"] == sum(len(corpus) - len(r["positive"]) for r in rows)
    assert rescore["seconds"] > 0 and rescore["kind"] == "cross-encoder"
    assert report["scores"] == "teacher (cross-encoder)"
    assert "dropped per query: mean / median / p90 / max" in (run / "mine_report.md").read_text()
    out = capsys.readouterr().out
    command = next(line for line in out.splitlines() if line.startswith("train on it: "))
    assert command.endswith("loss=distill_kl")

    # the teacher judged on each query's window next to the embedder that mined it (record beside the file):
    # BOOSTED, above every positive, makes the teacher's top1 0; its margins are the ones computed above
    record = json.loads((run / "mined.jsonl.teacher.json").read_text())
    assert record == {**rescore["judgement"], "scored_file": str(run / "mined.jsonl")}
    assert record["teacher_figures"]["groups"] == len(rows) and record["teacher_figures"]["top1"] == 0.0
    assert record["teacher_figures"]["mean_margin"] == pytest.approx(sum(margins) / len(margins), abs=1e-3)
    assert record["student"] == report["model"] and record["student_figures"]["groups"] == len(rows)
    assert record["student_figures"]["top1"] > 0  # the embedder puts some positives above its whole window
    assert "teacher on the rows' own labels: top1 0.0" in out
    assert "WARNING: data.train_file=" in out and "loss.allow_weak_teacher=true" in out  # said before training
    assert "judged before it teaches" in (run / "mine_report.md").read_text()

    # the printed command trains on the file with the teacher's scores (a tiny run of it): refused, since this
    # teacher ranks positives first less often than the embedder (or, with the embedder at the ceiling of the rows it
    # mined, below the floor), until the override
    overrides = shlex.split(command.removeprefix("train on it: python train.py "))
    cfg = make_cfg(["debug=fast", "logger=none", *overrides, "trainer.limit_train_batches=2"],
                   output_dir=tmp_path / "distill")
    assert cfg.loss._target_.endswith("DistillKLLoss") and cfg.data.num_negatives == 3
    with pytest.raises(ConfigError, match=r"less often than the student|in only 0\.000 of the rows' groups"):
        train(cfg)
    cfg = make_cfg(["debug=fast", "logger=none", *overrides, "trainer.limit_train_batches=2",
                    "loss.allow_weak_teacher=true"], output_dir=tmp_path / "distill")
    train(cfg)
    metrics = json.loads((tmp_path / "distill" / "metrics.json").read_text())
    assert metrics["global_step"] == 2 and math.isfinite(metrics["train"]["train/loss"])


# --- bad settings ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "message"), [
    (["mode=mine", "mine.rescore_kind=bogus"], "mine.rescore_kind='bogus': valid choices: null, cross-encoder, "
                                               "embedder"),
    (["mode=mine", "mine.rescore_with=t", "mine.rescore_batch_size=0"],
     "mine.rescore_batch_size=0: expected an integer >= 1"),
    (["mine.rescore_with=teacher", "data.remine.every_n_epochs=1"], "mine.rescore_with='teacher': not supported with "
                                                                    "data.remine"),
])
def test_bad_rescore_settings_are_config_errors(make_cfg, overrides, message):
    from gte_pro.train import train

    with pytest.raises(ConfigError, match=message):
        train(make_cfg(overrides))


def test_a_relative_margin_on_logits_is_refused(make_cfg, tmp_path: Path, teacher_folder: Path):
    from gte_pro.train import train

    overrides = [o for o in _mine_overrides(tmp_path, teacher_folder) if not o.startswith("mine.relative_margin")]
    with pytest.raises(ConfigError, match=r"mine.relative_margin=0.05: .* a cross-encoder's are logits"):
        train(make_cfg(overrides, output_dir=tmp_path / "refused"))
    assert not (tmp_path / "refused" / "mined.jsonl").exists()


def test_rescore_options_name_the_key(make_cfg):
    from gte_pro.config.checks import config_problems

    assert rescore_options({"rescore_with": None}) is None
    assert rescore_options({"rescore_with": "t", "rescore_kind": "embedder", "rescore_batch_size": 8,
                            "rescore_max_length": 64}).kind == "embedder"
    problems = config_problems(make_cfg(["mine.rescore_with='  '", "mine.rescore_max_length=0"]))
    assert ("mine.rescore_with='  ': expected a folder or hub name, a non-empty list of them (an ensemble), or null"
            in problems)
    assert rescore_options({"rescore_with": ["a", "b"], "rescore_kind": None, "rescore_batch_size": 8,
                            "rescore_max_length": 64}).name_or_path == ("a", "b")
    assert "mine.rescore_max_length=0: expected an integer >= 1" in problems
