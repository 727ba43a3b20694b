"""Model soups (mode=merge): the weight arithmetic, the refusals before any weight is read, the greedy soup, and the
exported soup as sentence-transformers loads it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from gte_pro import packaged_minilm_path
from gte_pro.errors import EXIT_USER_ERROR, SHOW_TRACEBACK, exit_on_user_error
from gte_pro.models.soup import slerp, slerp_tensor, uniform
from tests.conftest import write_jsonl

TINY = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
        "max_position_embeddings": 128}
TEXTS = ["what is topic number 3?", "Topic 7 is a subject that covers item 7 in depth.", "tiny"]


def tiny_member(folder: Path, seed: int, **config: int) -> Path:
    """A tiny random BERT (the packaged tokenizer), exported as a sentence-transformers folder."""
    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(seed)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config={**TINY, **config}, max_length=32)
    return export_sentence_transformers(encoder, folder)


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


@pytest.fixture
def two_tiny(tmp_path: Path) -> tuple[Path, Path]:
    return tiny_member(tmp_path / "a", seed=1), tiny_member(tmp_path / "b", seed=2)


@pytest.fixture
def val_data(tmp_path: Path) -> list[str]:
    """data=jsonl with a training file and a validation file of 24 queries (made-up topics)."""
    def rows(start: int, stop: int) -> list[dict[str, str]]:
        return [{"query": f"what is topic number {i}?",
                 "positive": f"Topic {i} is a subject that covers item {i} in depth, with examples."}
                for i in range(start, stop)]

    train = write_jsonl(tmp_path / "train.jsonl", rows(0, 40))
    val = write_jsonl(tmp_path / "val.jsonl", rows(100, 124))
    return ["data=jsonl", f"data.train_file={train}", f"data.val_file={val}", "data.val_distractors=0",
            "logger=none", "data.max_length=32"]


# --- the arithmetic ----------------------------------------------------------------------------------------------
def test_uniform_of_two_tiny_models_is_the_mean_of_their_tensors(two_tiny):
    a, b = weights(two_tiny[0]), weights(two_tiny[1])
    soup = uniform([a, b])
    assert soup.keys() == a.keys()
    for key, tensor in a.items():
        expected = ((tensor.double() + b[key].double()) / 2).to(tensor.dtype) if tensor.is_floating_point() else tensor
        assert torch.equal(soup[key], expected), key
    assert not torch.equal(soup["embeddings.word_embeddings.weight"], a["embeddings.word_embeddings.weight"])


def test_slerp_ends_are_the_members_and_parallel_tensors_interpolate_linearly(two_tiny):
    a, b = weights(two_tiny[0]), weights(two_tiny[1])
    start, end = slerp([a, b], 0.0), slerp([a, b], 1.0)
    for key in a:
        assert torch.equal(start[key], a[key]), key
        assert torch.allclose(end[key], b[key], rtol=0, atol=1e-7), key
    x = torch.randn(4, 8)
    assert torch.allclose(slerp_tensor(x, 3 * x, 0.5), 2 * x, atol=1e-6)  # parallel: (x + 3x) / 2
    assert torch.allclose(slerp_tensor(x, -x, 0.25), 0.5 * x, atol=1e-6)  # anti-parallel too: no angle to divide by
    # orthogonal unit vectors: the midpoint stays on the sphere (linear would have norm 0.707)
    mid = slerp_tensor(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]), 0.5)
    assert torch.allclose(mid, torch.tensor([0.5**0.5, 0.5**0.5]))


# --- mistakes: two lines, exit code 2, before any weight is read -------------------------------------------------
def _refused(make_cfg, overrides: list[str], monkeypatch, capsys) -> list[str]:
    from gte_pro.modes import merge as merge_mode
    from gte_pro.train import train

    def no_weights(*args, **kwargs):
        raise AssertionError("weights were loaded before the refusal")

    monkeypatch.setattr(merge_mode, "build_encoder", no_weights)
    monkeypatch.setenv(SHOW_TRACEBACK, "0")
    cfg = make_cfg(["mode=merge", "logger=none", *overrides])
    capsys.readouterr()  # what making the members printed (transformers' progress bars)
    with pytest.raises(SystemExit) as stopped, exit_on_user_error():
        train(cfg)
    assert stopped.value.code == EXIT_USER_ERROR
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("error: ") and lines[1].startswith("  fix: "), lines
    return lines


def test_members_of_different_hidden_sizes_are_refused_before_loading(make_cfg, tmp_path, monkeypatch, capsys):
    small = tiny_member(tmp_path / "small", seed=1)
    wide = tiny_member(tmp_path / "wide", seed=1, hidden_size=64)
    lines = _refused(make_cfg, [f"merge.models=[{small},{wide}]"], monkeypatch, capsys)
    assert f"{wide} and {small} differ in their config.json: hidden_size is 64" in lines[0]
    assert "merge only fine-tunes of one base model" in lines[1]


def test_a_missing_tensor_and_a_folder_without_a_model_are_named(make_cfg, two_tiny, tmp_path, monkeypatch, capsys):
    first, second = two_tiny
    state = weights(second)
    state.pop("encoder.layer.1.output.dense.bias")
    save_file(state, str(second / "model.safetensors"))
    lines = _refused(make_cfg, [f"merge.models=[{first},{second}]"], monkeypatch, capsys)
    assert "differ in their tensors: model.safetensors:encoder.layer.1.output.dense.bias is missing" in lines[0]
    empty = tmp_path / "not_a_model"
    empty.mkdir()
    lines = _refused(make_cfg, [f"merge.models=[{first},{empty}]"], monkeypatch, capsys)
    assert lines[0] == f"error: merge.models: {empty} is not a model folder (no config.json)"


def test_slerp_of_three_and_a_single_member_are_refused(make_cfg, two_tiny, tmp_path, monkeypatch, capsys):
    third = tiny_member(tmp_path / "c", seed=3)
    lines = _refused(make_cfg, [f"merge.models=[{two_tiny[0]},{two_tiny[1]},{third}]", "merge.method=slerp"],
                     monkeypatch, capsys)
    assert "merge.method=slerp interpolates exactly two models; merge.models has 3" in lines[0]
    lines = _refused(make_cfg, [f"merge.models=[{third}]"], monkeypatch, capsys)
    assert "mode=merge needs at least two" in lines[0]


# --- runs ----------------------------------------------------------------------------------------------------------
def test_the_uniform_soup_is_exported_verified_and_loads_in_sentence_transformers(make_cfg, two_tiny, val_data,
                                                                                  tmp_path):
    from sentence_transformers import SentenceTransformer

    from gte_pro.models.encoder import Encoder
    from gte_pro.train import train

    run = tmp_path / "soup"
    value = train(make_cfg(["mode=merge", f"merge.models=[{two_tiny[0]},{two_tiny[1]}]", *val_data],
                           output_dir=run))
    summary = json.loads((run / "metrics.json").read_text())
    assert summary["method"] == "uniform" and value == summary["val"]["val/ndcg@10"]
    assert [m["model"] for m in summary["members"]] == [str(two_tiny[0]), str(two_tiny[1])]
    assert all("val/ndcg@10" in m["val"] for m in summary["members"])
    assert summary["exports"]["min_cosine"]["sentence_transformers"] > 0.9999  # the release path's verification
    # the exported weights are the hand-computed mean
    expected = uniform([weights(two_tiny[0]), weights(two_tiny[1])])
    exported = weights(run / "model")
    for key, tensor in expected.items():
        assert torch.equal(exported[key], tensor), key
    # sentence-transformers' embeddings are those of an encoder holding the merged weights
    merged = Encoder.load(str(two_tiny[0]), max_length=256)
    assert not merged.backbone.load_state_dict(expected, strict=False).missing_keys
    theirs = SentenceTransformer(str(run / "model"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert torch.allclose(theirs.cpu(), merged.encode(TEXTS), atol=1e-5)
    assert "soup (uniform)" in (run / "metrics.md").read_text()


def shuffled_minilm(folder: Path) -> Path:
    """MiniLM with every floating tensor's values shuffled: its shapes and statistics, none of its function."""
    from gte_pro.export.writers import export_sentence_transformers
    from gte_pro.models.encoder import Encoder

    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), max_length=32)
    with torch.no_grad():
        for parameter in encoder.parameters():
            flat = parameter.view(-1)
            flat.copy_(flat[torch.randperm(flat.numel())])
    return export_sentence_transformers(encoder, folder)


@pytest.mark.slow
def test_greedy_skips_a_bad_member_and_is_no_worse_than_the_best(make_cfg, val_data, tmp_path, caplog):
    from gte_pro.train import train

    good = Path(packaged_minilm_path())
    twin = Path(shutil.copytree(good, tmp_path / "twin"))
    bad = shuffled_minilm(tmp_path / "bad")
    run = tmp_path / "greedy"
    with caplog.at_level("INFO", logger="gte_pro.modes.merge"):
        train(make_cfg(["mode=merge", f"merge.models=[{bad},{good},{twin}]", "merge.method=greedy", "export.hf=false",
                        *val_data], output_dir=run))
    summary = json.loads((run / "metrics.json").read_text())
    steps = {step["member"]: step for step in summary["greedy_steps"]}
    assert [step["member"] for step in summary["greedy_steps"]] == [str(good), str(twin), str(bad)]  # best first
    assert steps[str(twin)]["kept"] is True  # the soup of two equal members scores the same: kept (>=)
    assert steps[str(bad)]["kept"] is False
    best = max(m["val"]["val/ndcg@10"] for m in summary["members"])
    assert summary["val"]["val/ndcg@10"] >= best
    assert any("skipped" in record.message and str(bad) in record.message for record in caplog.records)
    assert "skipped" in (run / "metrics.md").read_text()


# --- a sweep's soup ------------------------------------------------------------------------------------------------
def test_a_sweeps_soup_row_and_table_and_the_members_it_takes(tmp_path):
    from omegaconf import OmegaConf

    from gte_pro.launch.sweep import summarize_sweep
    from gte_pro.modes.soup import finished_models, soup_config

    sweep = tmp_path / "sweep"
    for job, value in (("0", 0.5), ("1", 0.6), ("2", None)):  # job 2 did not finish
        (sweep / job / ".hydra").mkdir(parents=True)
        (sweep / job / ".hydra" / "overrides.yaml").write_text(f"- model.lr={job}e-5\n")
        if value is not None:
            (sweep / job / "model").mkdir()
            (sweep / job / "model" / "config.json").write_text("{}")
            (sweep / job / "metrics.json").write_text(json.dumps({"val": {"val/ndcg@10": value}}))
    models = finished_models(sweep)
    assert models == [sweep / "0" / "model", sweep / "1" / "model"]
    cfg = soup_config(OmegaConf.create({"mode": "train", "merge": {"models": [], "method": "uniform"},
                                        "paths": {"output_dir": "${hydra:runtime.output_dir}"},
                                        "hydra": {"sweep": {"dir": str(sweep)}}}), models, "greedy", sweep / "soup")
    assert (cfg.mode, cfg.merge.method, cfg.paths.output_dir, "hydra" in cfg) == ("merge", "greedy",
                                                                                  str(sweep / "soup"), False)
    (sweep / "soup").mkdir()
    (sweep / "soup" / "metrics.json").write_text(json.dumps({
        "method": "greedy", "metric": "val/ndcg@10", "val": {"val/ndcg@10": 0.65},
        "members": [{"model": str(m), "val": {"val/ndcg@10": v}} for m, v in zip(models, (0.5, 0.6), strict=True)],
        "greedy_steps": [{"member": str(models[1]), "kept": True}, {"member": str(models[0]), "kept": False}]}))
    rows = summarize_sweep(sweep)
    assert [row["job"] for row in rows[:3]] == ["soup", "1", "0"]  # best first
    assert rows[0]["overrides"] == "sweep.soup=greedy of jobs 1" and rows[0]["val/ndcg@10"] == 0.65
    table = (sweep / "soup.md").read_text()
    assert "| 0 | 0.5000 | skipped |" in table and "| soup (greedy) | 0.6500 |" in table
    assert "| soup |" in (sweep / "summary.md").read_text()
