"""Every "next step" command a run prints runs (issue 30, item 3): the line is parsed as bash would, composed as
``python train.py`` would, given debug sizes only (``debug=fast`` and the like, appended after its own overrides),
and trained in-process; the test then looks for what it writes. tests/test_docs_commands.py composes the commands
of the docs; here the printed ones are run.

- ``mode=mine`` -> ``train on it: python train.py data=jsonl data.train_file=<run>/mined.jsonl ...``
- ``mode=score`` -> ``train on it: python train.py loss=distill_kl data=jsonl data.train_file=<run>/scored.jsonl``
- ``task=rerank`` (gte_pro.modes.handoff) -> score with it, mine with it, distil (``experiment=distill``); slow
- a sweep's report.md -> ``python train.py <the best job's overrides>``
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.train import train
from tests.conftest import write_jsonl
from tests.test_docs_commands import parse

DEBUG = ["debug=fast", "logger=none"]  # a real run in seconds (conf/debug/fast.yaml); no curves to draw
SCORE_SIZES = ["score.batch_size=16", "score.max_length=64"]
TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}


def printed(out: str, lead: str) -> list[str]:
    """The commands of the printed lines that start with ``lead`` (``train on it: python train.py ...``), from
    ``python train.py`` on."""
    command = "python train.py"
    return [line[line.index(command):].strip() for line in out.splitlines()
            if line.lstrip().startswith(lead) and command in line]


def run_printed(make_cfg, command: str, output_dir: Path, *sizes: str) -> Path:
    """Run one printed command as ``python train.py`` would, at debug sizes; the run folder."""
    cmd = parse("printed", command)
    assert not cmd.multirun and not cmd.elided, command
    train(make_cfg([*cmd.overrides, *sizes], output_dir=output_dir))
    return output_dir


def assert_trained(run: Path) -> dict:
    """The run trained (a finite loss after some steps) and exported its model; its metrics.json."""
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["global_step"] > 0 and math.isfinite(metrics["train"]["train/loss"])
    assert (run / "model").is_dir()
    return metrics


@pytest.fixture
def rows_file(tmp_path: Path) -> Path:
    """80 rows with 3 hard negatives each (FlagEmbedding's layout)."""
    return write_jsonl(tmp_path / "rows.jsonl", [{
        "query": f"what is topic number {i}?",
        "pos": [f"Topic {i} is a subject that covers item {i} in depth, with examples."],
        "neg": [f"Unrelated passage {i}-{j} about the weather in city {j}." for j in range(3)]} for i in range(80)])


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random cross-encoder folder, as a task=rerank export looks."""
    from gte_pro.models.cross_encoder import CrossEncoder

    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("teacher") / "cross-encoder"
    CrossEncoder.load(packaged_minilm_path(), max_length=64, random_init_config={**TINY, "initializer_range": 0.5}
                      ).save(folder)
    return folder


def test_the_command_mode_mine_prints_trains(make_cfg, rows_file: Path, tmp_path: Path, capsys):
    mine = ["mode=mine", "model=tiny", "data=jsonl", f"data.train_file={rows_file}", "data.val_fraction=0.1",
            "mine.num_negatives=4", "mine.range_min=0", "mine.range_max=40", "mine.relative_margin=null"]
    train(make_cfg(mine, output_dir=tmp_path / "mine"))
    [command] = printed(capsys.readouterr().out, "train on it: ")
    assert f"data.train_file={tmp_path / 'mine' / 'mined.jsonl'}" in command
    assert_trained(run_printed(make_cfg, command, tmp_path / "train", *DEBUG))


def test_the_command_mode_score_prints_distils(make_cfg, rows_file: Path, teacher: Path, tmp_path: Path, capsys):
    train(make_cfg(["mode=score", f"score.teacher={teacher}", "data=jsonl", f"data.train_file={rows_file}",
                    *SCORE_SIZES], output_dir=tmp_path / "score"))
    [command] = printed(capsys.readouterr().out, "train on it: ")
    # before: data.num_negatives defaulted to 0 and this line failed at the first step ("needs hard negatives")
    assert command == f"python train.py loss=distill_kl data=jsonl data.train_file={tmp_path / 'score/scored.jsonl'}"
    run = run_printed(make_cfg, command, tmp_path / "train", *DEBUG)
    assert assert_trained(run)["num_negatives"] == 3  # every scored negative of the file's rows


@pytest.mark.slow  # ~40 s on 2 cores: a reranker, then the three runs its handoff prints and the one mining prints
def test_the_commands_a_reranker_prints_run(make_cfg, rows_file: Path, tmp_path: Path, capsys):
    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)
    retriever = export_sentence_transformers(
        Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=64), tmp_path / "retriever")
    train(make_cfg(["task=rerank", "debug=fast", "logger=none", "model=reranker_tiny", "data=jsonl",
                    f"data.train_file={rows_file}", f"eval.retriever={retriever}", "eval.rerank_depth=20"],
                   output_dir=tmp_path / "reranker"))
    out = capsys.readouterr().out
    [score], [mine], [distil] = (printed(out, lead) for lead in ("python train.py mode=score",
                                                                 "python train.py mode=mine", "then: "))
    assert score.startswith("python train.py mode=score") and "mine.rescore_with=" in mine
    run_printed(make_cfg, score, tmp_path / "score", *SCORE_SIZES)
    assert (tmp_path / "score" / "scored.jsonl").is_file()
    capsys.readouterr()  # its own "train on it:" line: the test above runs that one
    run_printed(make_cfg, mine, tmp_path / "mine", "model=tiny", "mine.range_max=40", "mine.rescore_batch_size=16")
    out = capsys.readouterr().out
    [after_mine] = printed(out, "train on it: ")
    assert "loss=distill_kl" in after_mine  # the mined rows carry the reranker's scores
    # a reranker of a few debug steps is a weak teacher: the run says so, and distillation needs the override
    assert "WARNING: data.train_file=" in out and "loss.allow_weak_teacher=true" in out
    weak = "loss.allow_weak_teacher=true"
    assert_trained(run_printed(make_cfg, after_mine, tmp_path / "distil_mined", *DEBUG, weak))
    distil = distil.replace("<that run>", str(tmp_path / "score"))
    assert_trained(run_printed(make_cfg, distil, tmp_path / "distil_scored", *DEBUG, weak))


def test_the_command_a_sweep_report_prints_trains(make_cfg, rows_file: Path, tmp_path: Path):
    from gte_pro.launch.sweep import summarize_sweep
    from gte_pro.utils.plots import plot_sweep

    sweep = tmp_path / "sweep"  # two finished jobs as Hydra leaves them: overrides.yaml and metrics.json
    for job, (lr, ndcg) in enumerate([("1e-3", 0.4), ("2e-3", 0.6)]):
        (sweep / str(job) / ".hydra").mkdir(parents=True)
        (sweep / str(job) / ".hydra" / "overrides.yaml").write_text(
            f"- model.lr={lr}\n- hydra/launcher=local\n- hparams_search=lr_sweep\n- data=jsonl\n"
            f"- data.train_file={rows_file}\n")
        (sweep / str(job) / "metrics.json").write_text(json.dumps({"val": {"val/ndcg@10": ndcg}}))
    report = plot_sweep(sweep, summarize_sweep(sweep), "val/ndcg@10").read_text()
    [command] = [line.split("`")[1] for line in report.splitlines() if line.startswith("Train it alone: ")]
    # the job's own overrides, without those of the sweep (a launcher, the preset that makes it a sweep)
    assert command == f"python train.py model.lr=2e-3 data=jsonl data.train_file={rows_file}"
    assert_trained(run_printed(make_cfg, command, tmp_path / "best", *DEBUG))
