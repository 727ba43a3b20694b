"""``mode=score`` (gte_pro.scoring, gte_pro.modes.score): the scores are the teacher's, the rows come back unchanged
with FlagEmbedding's pos_scores / neg_scores, the file trains with ``loss=distill_kl``, a bad row names its file and
line, a killed run resumes to the same bytes without scoring its finished shards again, a changed teacher or input
is refused, and 2 gloo ranks write the file 1 rank writes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.errors import ConfigError, DataError, ResumeError
from tests.conftest import REPO, write_jsonl

# weights of a wide initial spread: the default (0.02) gives every pair the same logit to 4 decimals
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "initializer_range": 0.5}
ROWS = 50


@pytest.fixture(scope="module")
def cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder folder, as a task=rerank export looks (config.json names the classifier)."""
    from gte_pro.models.cross_encoder import CrossEncoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("teacher") / "cross-encoder"
    CrossEncoder.load(packaged_minilm_path(), max_length=64, random_init_config=TINY).save(folder)
    return folder


@pytest.fixture(scope="module")
def embedder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random embedder folder (an encoder export: config.json names no classifier)."""
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("teacher") / "embedder"
    Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=64).save(folder)
    return folder


def _rows() -> list[dict]:
    """Both layouts, a single-string positive, two positives, rows with 0-3 negatives, extra fields, old scores."""
    rows = []
    for i in range(ROWS):
        negatives = [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(i % 4)]
        if i % 2:
            rows.append({"id": f"r{i}", "query": f"what is topic number {i}?",
                         "pos": [f"Topic {i} is a subject that covers item {i} in depth, with examples."]
                         + ([f"A second answer about topic {i}."] if i % 5 == 0 else []), "neg": negatives})
        else:
            rows.append({"query": f"how does thing {i} work?", "positive": f"Thing {i} works by turning gear {i}.",
                         "negatives": negatives, "source": {"name": "made-up", "n": i}})
    rows[3]["pos_scores"], rows[3]["neg_scores"] = [9.0], [1.0, 2.0, 3.0]  # old scores are replaced
    return rows


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "train.jsonl", _rows())


def _overrides(teacher: Path | str, train_file: Path, *extra: str) -> list[str]:
    return ["mode=score", f"score.teacher={teacher}", "data=jsonl", f"data.train_file={train_file}",
            "score.shard_rows=16", "score.batch_size=8", "score.max_length=64", *extra]


def _score(make_cfg, overrides: list[str], run: Path) -> dict:
    from gte_pro.train import train

    assert train(make_cfg(overrides, output_dir=run)) is None
    return json.loads((run / "score_report.json").read_text())


def _texts(row: dict) -> tuple[list[str], list[str]]:
    positives = row.get("pos", row.get("positive"))
    negatives = row.get("neg", row.get("negatives", []))
    return [positives] if isinstance(positives, str) else positives, negatives


@pytest.mark.parametrize("kind", ["cross-encoder", "embedder"])
def test_the_scores_are_the_teachers_and_the_rows_come_back_unchanged(make_cfg, request, train_file: Path,
                                                                     tmp_path: Path, kind: str, capsys):
    from gte_pro.models.teacher import load_teacher

    path = request.getfixturevalue("cross_encoder" if kind == "cross-encoder" else "embedder")
    run = tmp_path / "run"
    report = _score(make_cfg, _overrides(path, train_file), run)
    teacher = load_teacher(str(path), max_length=64)
    assert teacher.kind == report["kind"] == kind
    lines = (run / "scored.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(lines) == ROWS
    suspects, queries, docs, got = 0, [], [], []
    for line, row in zip(lines, _rows(), strict=True):
        scored = json.loads(line)
        assert {k: v for k, v in scored.items() if not k.endswith("_scores")} == {
            k: v for k, v in row.items() if not k.endswith("_scores")}
        positives, negatives = _texts(row)
        assert len(scored["pos_scores"]) == len(positives) and len(scored["neg_scores"]) == len(negatives)
        queries += [row["query"]] * len(positives + negatives)
        docs += positives + negatives
        got += scored["pos_scores"] + scored["neg_scores"]
        suspects += sum(score >= max(scored["pos_scores"]) for score in scored["neg_scores"])
    # the teacher on all pairs at once, in other batches than the shards' (4 pairs, across rows)
    torch.testing.assert_close(torch.tensor(got), teacher.score(queries, docs, batch_size=4), atol=1e-6, rtol=1e-6)
    assert torch.tensor(got).std() > 0.02  # the scores differ from pair to pair: the comparison above bites
    pairs = len(got)
    assert report["rows"] == ROWS and report["pairs"] == report["pairs_scored"] == pairs
    assert report["shards"] == report["shards_scored"] == 4 and report["shards_reused"] == 0
    assert report["likely_false_negatives"] == suspects
    assert report["positive_scores"]["count"] == report["positives"] and report["pairs_per_s"] > 0
    assert report["negative_scores"]["min"] <= report["negative_scores"]["median"] <= report["negative_scores"]["max"]
    assert (run / "score_hist.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "likely false negatives" in (run / "score_report.md").read_text()
    out = capsys.readouterr().out
    assert f"train on it: python train.py loss=distill_kl data=jsonl data.train_file={run / 'scored.jsonl'}" in out


def test_the_scored_file_trains_with_distill_kl(make_cfg, cross_encoder: Path, train_file: Path, tmp_path: Path):
    from gte_pro.data.records import iter_pairs_jsonl
    from gte_pro.train import train

    scored = tmp_path / "scored.jsonl"
    _score(make_cfg, _overrides(cross_encoder, train_file, f"score.output={scored}"), tmp_path / "score")
    examples = list(iter_pairs_jsonl(scored))  # the training reader: scores checked against their texts
    assert len(examples) == ROWS and all(ex.pos_scores is not None and ex.neg_scores is not None for ex in examples)
    run = tmp_path / "train"
    train(make_cfg(["debug=fast", "logger=none", "loss=distill_kl", "data=jsonl", f"data.train_file={scored}",
                    "data.num_negatives=2", "data.val_fraction=0.2", "trainer.limit_train_batches=2"], output_dir=run))
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["global_step"] == 2 and math.isfinite(metrics["train"]["train/loss"])


def test_a_bad_row_names_the_file_and_line_before_anything_is_scored(make_cfg, cross_encoder: Path, tmp_path: Path):
    rows = _rows()
    rows[40] = {"query": "a query", "pos": [3]}
    path = write_jsonl(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataError, match=rf"{path}, line 41: field 'pos' must be a string or a list of strings"):
        _score(make_cfg, _overrides(cross_encoder, path), tmp_path / "run")
    assert not list((tmp_path / "run" / "score_shards").glob("*.jsonl"))


@pytest.mark.parametrize("kind", ["cross-encoder", "ensemble"])
def test_a_killed_run_resumes_to_the_same_bytes(make_cfg, request, train_file: Path, tmp_path: Path, monkeypatch,
                                                kind: str):
    """A cross-encoder scores shard by shard; an ensemble (here of a cross-encoder and an embedder) scores the whole
    file first, in batches made from the whole file, so the shards a resumed run writes are the same bytes too."""
    from gte_pro.scoring import core
    from gte_pro.scoring.shards import ShardFolder

    cross_encoder = request.getfixturevalue("cross_encoder")
    if kind == "ensemble":
        cross_encoder = f"[{cross_encoder},{request.getfixturevalue('embedder')}]"

    _score(make_cfg, _overrides(cross_encoder, train_file), tmp_path / "whole")
    write = ShardFolder.write

    def killed_after_one(self, index, *args):
        if list(self.folder.glob("*.json")):
            raise RuntimeError("killed after one shard")
        return write(self, index, *args)

    monkeypatch.setattr(ShardFolder, "write", killed_after_one)
    run = tmp_path / "killed"
    with pytest.raises(RuntimeError, match="killed after one shard"):
        _score(make_cfg, _overrides(cross_encoder, train_file), run)
    assert sorted(p.name for p in (run / "score_shards").iterdir()) == ["000000.json", "000000.jsonl"]
    assert not (run / "scored.jsonl").exists()
    monkeypatch.setattr(ShardFolder, "write", write)
    scored_now: list[int] = []
    score_shard = core.score_shard
    monkeypatch.setattr(core, "score_shard", lambda teacher, shard, *a: scored_now.append(shard.index)
                        or score_shard(teacher, shard, *a))
    report = _score(make_cfg, _overrides(cross_encoder, train_file), run)
    assert scored_now == [1, 2, 3] and report["shards_reused"] == 1 and report["shards_scored"] == 3
    assert (run / "scored.jsonl").read_bytes() == (tmp_path / "whole" / "scored.jsonl").read_bytes()
    # another teacher setting, or other rows, in the same folder: refused, never mixed
    with pytest.raises(ResumeError, match=r"000000.json: shard 0 was scored with other settings \(max_length"):
        _score(make_cfg, _overrides(cross_encoder, train_file, "score.max_length=32"), run)
    rows = _rows()
    rows[20]["query"] = "an edited query"
    write_jsonl(train_file, rows)
    with pytest.raises(ResumeError, match=r"000001.json: shard 1 \(rows 17.. of the input\) was scored from other"):
        _score(make_cfg, _overrides(cross_encoder, train_file), run)
    assert scored_now == [1, 2, 3]


def test_mistakes_in_the_score_keys_name_the_key(make_cfg, cross_encoder: Path, train_file: Path, tmp_path: Path):
    from gte_pro.errors import MissingModelError

    with pytest.raises(ConfigError, match="score.teacher is required with mode=score"):
        _score(make_cfg, ["mode=score"], tmp_path / "a")
    with pytest.raises(ConfigError, match="score.input: not set"):
        _score(make_cfg, ["mode=score", f"score.teacher={cross_encoder}"], tmp_path / "b")
    with pytest.raises(ConfigError, match=r"score.teacher_kind='reranker': valid choices: cross-encoder, embedder"):
        _score(make_cfg, _overrides(cross_encoder, train_file, "score.teacher_kind=reranker"), tmp_path / "c")
    with pytest.raises(ConfigError, match=r"score.shard_rows=0: expected an integer >= 1"):
        _score(make_cfg, _overrides(cross_encoder, train_file, "score.shard_rows=0"), tmp_path / "d")
    with pytest.raises(ConfigError, match=r"is the input file"):
        _score(make_cfg, _overrides(cross_encoder, train_file, f"score.output={train_file}"), tmp_path / "e")
    with pytest.raises(MissingModelError, match=r"score.teacher=/no/such/teacher: no such folder"):
        _score(make_cfg, _overrides("/no/such/teacher", train_file), tmp_path / "f")


@pytest.mark.slow  # ~30 s on 2 cores: two processes that start Lightning, like mode=mine's DDP test
def test_two_ddp_ranks_write_the_file_one_rank_writes(make_cfg, cross_encoder: Path, train_file: Path,
                                                      tmp_path: Path, cache_dir: Path):
    overrides = _overrides(cross_encoder, train_file, "score.shard_rows=7")  # 8 shards: uneven, the last short
    _score(make_cfg, overrides, tmp_path / "one")
    cmd = [sys.executable, "train.py", *overrides, "strategy=ddp", "devices=2", f"hydra.run.dir={tmp_path / 'two'}",
           f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    report = json.loads((tmp_path / "two" / "score_report.json").read_text())
    assert report["world_size"] == 2 and report["shards"] == report["shards_scored"] == 8
    markers = [json.loads(p.read_text()) for p in sorted((tmp_path / "two" / "score_shards").glob("*.json"))]
    assert [m["rank"] for m in markers] == [0, 1] * 4  # shard i by rank i % 2
    assert (tmp_path / "two" / "scored.jsonl").read_bytes() == (tmp_path / "one" / "scored.jsonl").read_bytes()


SLURM_RANK_1_OF_2 = {"SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "2", "SLURM_JOB_NAME": "job", "SLURM_JOB_ID": "7",
                     "SLURM_NODELIST": "localhost", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_NODEID": "0"}


def test_fabric_runs_where_the_trainer_would(make_cfg, monkeypatch):
    """mode=score and mode=mine run on Fabric (gte_pro.modes.build.build_fabric): under SLURM it finds the same
    cluster environment, rank, world size and DDP options as the Trainer; a strategy it cannot run is refused."""
    from lightning.fabric.utilities.rank_zero import rank_zero_only

    from gte_pro.modes.build import build_fabric, build_trainer

    # building either sets the process-wide rank (1 here); later tests in this process write as rank 0
    monkeypatch.setattr(rank_zero_only, "rank", rank_zero_only.rank)
    for key, value in SLURM_RANK_1_OF_2.items():
        monkeypatch.setenv(key, value)
    cfg = make_cfg(["mode=score", "strategy=ddp", "devices=2", "trainer.accelerator=cpu"])
    fabric, trainer = build_fabric(cfg), build_trainer(cfg, callbacks=[], loggers=[])
    for runner in (fabric, trainer):
        assert type(runner.strategy.cluster_environment).__name__ == "SLURMEnvironment"
        assert (runner.global_rank, runner.world_size, runner.strategy._timeout) == (1, 2, trainer.strategy._timeout)
    with pytest.raises(ConfigError, match=r"mode=score: strategy .*FSDPStrategy is not supported.*strategy=ddp"):
        build_fabric(make_cfg(["mode=score", "strategy=fsdp", "devices=2", "trainer.accelerator=cpu"]))


def _groups_by_hand(scored_lines: list[str], flat: torch.Tensor):
    """The judge's groups from pair scores in file order, split by the scored rows' own pos/neg counts."""
    from gte_pro.scoring.judge import groups_from_rows

    rows, at = [], 0
    for line in scored_lines:
        row = json.loads(line)
        p, n = len(row["pos_scores"]), len(row["neg_scores"])
        rows.append((flat[at : at + p].tolist(), flat[at + p : at + p + n].tolist()))
        at += p + n
    return groups_from_rows(rows)


def test_the_teacher_is_judged_next_to_the_student_and_its_record_sits_beside_the_file(
        make_cfg, embedder: Path, cross_encoder: Path, train_file: Path, tmp_path: Path, capsys):
    from gte_pro.models.teacher import load_teacher
    from gte_pro.scoring.judge import judge
    from gte_pro.scoring.teacher_file import read_record

    run = tmp_path / "run"
    report = _score(make_cfg, _overrides(cross_encoder, train_file, f"score.student={embedder}"), run)
    record = read_record(run / "scored.jsonl")
    assert record == {**report["judgement"], "scored_file": str(run / "scored.jsonl")}
    assert record["kind"] == "cross-encoder" and record["temperature"] == 1.0  # logits read as trained
    lines = (run / "scored.jsonl").read_text(encoding="utf-8").splitlines()
    teacher = torch.tensor([s for row in map(json.loads, lines) for s in row["pos_scores"] + row["neg_scores"]])
    assert record["teacher_figures"] == judge(_groups_by_hand(lines, teacher), 1.0)
    # the student's cosines of the same pairs, each row's texts as scored (rows with negatives only)
    student = load_teacher(str(embedder), max_length=64, kind="embedder")
    queries, docs = [], []
    for row in _rows():
        positives, negatives = _texts(row)
        queries += [row["query"]] * len(positives + negatives)
        docs += positives + negatives
    by_hand = judge(_groups_by_hand(lines, student.score(queries, docs, batch_size=4)), 0.05)
    assert record["student"] == str(embedder) and record["student_figures"]["groups"] == by_hand["groups"] > 0
    for key in ("top1", "mean_margin", "mean_normalised_entropy"):
        assert record["student_figures"][key] == pytest.approx(by_hand[key], abs=2e-4)
    assert record["recommended_temperature"] > 0 and len(record["entropy_by_temperature"]) == 21
    assert "judged before it teaches" in (run / "score_report.md").read_text()
    assert "teacher on the rows' own labels: top1" in capsys.readouterr().out


def test_an_embedder_teacher_is_read_at_005_and_an_ensemble_judges_each_member(
        make_cfg, embedder: Path, cross_encoder: Path, train_file: Path, tmp_path: Path):
    from gte_pro.models.teacher import load_teacher, standardised
    from gte_pro.scoring.judge import judge

    report = _score(make_cfg, _overrides(embedder, train_file), tmp_path / "one")
    assert report["judgement"]["temperature"] == 0.05 and report["judgement"]["members"] == []
    run = tmp_path / "ensemble"
    report = _score(make_cfg, _overrides(f"[{cross_encoder},{embedder}]", train_file), run)
    record = report["judgement"]
    assert record["kind"] == "ensemble" and record["temperature"] == record["recommended_temperature"]
    lines = (run / "scored.jsonl").read_text(encoding="utf-8").splitlines()
    queries, docs = [], []
    for row in _rows():
        positives, negatives = _texts(row)
        queries += [row["query"]] * len(positives + negatives)
        docs += positives + negatives
    assert [m["teacher"] for m in record["members"]] == [str(cross_encoder), str(embedder)]
    for member, path in zip(record["members"], (cross_encoder, embedder), strict=True):
        z = standardised(load_teacher(str(path), max_length=64).score(queries, docs, batch_size=4))
        by_hand = judge(_groups_by_hand(lines, z), record["temperature"])
        for key in ("top1", "mean_margin", "mean_normalised_entropy"):
            assert member["figures"][key] == pytest.approx(by_hand[key], abs=2e-4)
