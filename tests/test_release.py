"""Exports that provably match: sentence-transformers, plain Hugging Face and ONNX each reproduce the module's
embeddings; the model card; the deployment checks; a bad export fails the run."""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from gte_pro.export.release import check_export_requirements
from gte_pro.export.verify import (
    ExportMismatchError,
    compare_devices,
    cpu_vs_device,
    state_dict_round_trip,
    verify_export,
)
from gte_pro.models.encoder import Encoder
from gte_pro.modes.build import build_encoder
from gte_pro.train import train
from tests.beir_data import st_evaluator_metrics, write_beir_folder

# not the texts the export was verified on
TEXTS = ["What makes bread rise?", "Yeast and bacteria in the starter produce gas that lifts the dough.", "ok",
         "passage: " + "a long document that gets truncated " * 40, "Grüße aus Köln 👋"]


@pytest.fixture(scope="module")
def release_run(tmp_path_factory, cache_dir):
    """One `debug=fast` fit on a BEIR folder with every export on (shared by this module's tests)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from tests.conftest import CONF

    root = tmp_path_factory.mktemp("release")
    beir_dir = write_beir_folder(root / "scifake")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["debug=fast", "logger=none", "callbacks=default",
                                          "callbacks.progress_bar=null", "data=beir", f"data.path={beir_dir}",
                                          f"eval.beir=[{beir_dir}]", "export.hf=true", "export.onnx=true"])
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.paths.output_dir = str(root / "run")
        cfg.paths.cache_dir = str(cache_dir)
    train(cfg)
    return cfg, root / "run", beir_dir


@pytest.fixture(scope="module")
def module_embeddings(release_run) -> torch.Tensor:
    """The Lightning module's embeddings of TEXTS: its encoder with the best checkpoint's weights."""
    cfg, run, _ = release_run
    state = torch.load(json.loads((run / "metrics.json").read_text())["best_checkpoint"], weights_only=False)
    encoder = build_encoder(cfg)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in state["state_dict"].items()
                             if k.startswith("encoder.")})
    return encoder.encode(TEXTS)


def _min_cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.float().cpu(), b.float().cpu(), dim=-1).min())


def test_sentence_transformers_reproduces_the_module(release_run, module_embeddings):
    from sentence_transformers import SentenceTransformer

    _, run, _ = release_run
    theirs = SentenceTransformer(str(run / "model"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert _min_cosine(theirs, module_embeddings) >= 0.9999
    torch.testing.assert_close(theirs.norm(dim=-1).cpu(), torch.ones(len(TEXTS)))


def test_automodel_with_the_documented_pooling_reproduces_the_module(release_run, module_embeddings, monkeypatch):
    """Runs the code block of <run>/hf/README.md as a user would copy it."""
    _, run, _ = release_run
    readme = (run / "hf" / "README.md").read_text()
    code = re.search(r"```python\n(.*?)```", readme, re.S).group(1)
    monkeypatch.chdir(run / "hf")
    scope: dict = {}
    exec(code, scope)
    assert json.loads((run / "hf" / "gte_pro_pooling.json").read_text())["pooling"] == "mean"
    assert scope["embeddings"].shape[0] == 2
    assert _min_cosine(scope["embed"](TEXTS), module_embeddings) >= 0.9999


def test_onnxruntime_reproduces_the_module_with_dynamic_shapes(release_run, module_embeddings):
    import onnxruntime
    from transformers import AutoTokenizer

    cfg, run, _ = release_run
    session = onnxruntime.InferenceSession(str(run / "model.onnx"), providers=["CPUExecutionProvider"])
    tokenizer = AutoTokenizer.from_pretrained(str(run / "model"))
    meta = session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["pooling"]) == "mean" and json.loads(meta["max_length"]) == cfg.data.max_length

    def embed(texts: list[str]) -> torch.Tensor:
        batch = tokenizer(texts, padding=True, truncation=True, max_length=cfg.data.max_length, return_tensors="np")
        return torch.from_numpy(session.run(["embeddings"], {"input_ids": batch["input_ids"],
                                                             "attention_mask": batch["attention_mask"]})[0])

    # one batch of five (padded), then one text at a time: other batch sizes and sequence lengths than traced
    assert _min_cosine(embed(TEXTS), module_embeddings) >= 0.9999
    assert _min_cosine(torch.cat([embed([t]) for t in TEXTS]), module_embeddings) >= 0.9999


def test_metrics_json_records_the_verified_exports_and_deployment_checks(release_run):
    _, run, _ = release_run
    metrics = json.loads((run / "metrics.json").read_text())
    exports = metrics["exports"]
    assert set(exports["min_cosine"]) == {"sentence_transformers", "hf", "onnx"}
    assert min(exports["min_cosine"].values()) >= 0.9999
    assert exports["state_dict_round_trip_max_abs_diff"] == 0.0
    if torch.cuda.is_available():
        assert exports["cpu_vs_gpu_max_abs_diff"] <= 1e-4
    else:
        assert exports["cpu_vs_gpu_max_abs_diff"] is None
    # BEIR set validated during training and at the end, under its own name; the held-out split keeps val/ndcg@10
    assert {"val/ndcg@10", "val/scifake/ndcg@10", "val/scifake/map@100"} <= set(metrics["val"])
    assert set(metrics["val_before"]) == set(metrics["val"])
    assert "| scifake |" in (run / "metrics.md").read_text()


def test_model_card_names_base_model_data_loss_hyperparameters_and_metrics(release_run):
    cfg, run, beir_dir = release_run
    card = (run / "model" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: sentence-transformers")
    for expected in ("a randomly initialised bert", "BeirDataModule", str(beir_dir), "InfoNCELoss",
                     "| temperature | 0.05 |", "| learning rate | 0.001 |", "| batch size per device | 8 |",
                     "| optimizer steps | 2 |",
                     "| set | ndcg@10 | ndcg@10 before |", "| scifake |", "| held-out |", "SentenceTransformer("):
        assert expected in card, expected


def test_evaluating_the_export_reproduces_training_and_sentence_transformers(release_run, make_cfg, tmp_path):
    """`mode=eval` on <run>/model gives the final val/scifake/* numbers of training and those of ST's evaluator."""
    from sentence_transformers import SentenceTransformer

    from gte_pro.data.beir import load_beir

    cfg, run, beir_dir = release_run
    eval_cfg = make_cfg(["mode=eval", "model=encoder", f"model.name_or_path={run / 'model'}",
                         f"data.max_length={cfg.data.max_length}", f"eval.beir=[{beir_dir}]"],
                        output_dir=tmp_path / "eval")
    train(eval_cfg)
    ours = json.loads((tmp_path / "eval" / "metrics.json").read_text())["sets"]["scifake"]["metrics"]
    trained = json.loads((run / "metrics.json").read_text())["val"]
    assert ours == pytest.approx({k.removeprefix("val/scifake/"): v for k, v in trained.items()
                                  if k.startswith("val/scifake/")}, abs=1e-6)
    theirs = st_evaluator_metrics(SentenceTransformer(str(run / "model"), device="cpu"), load_beir(beir_dir, "test"))
    assert ours == pytest.approx(theirs, abs=1e-4)
    assert 0.0 < ours["ndcg@10"] < 1.0  # a random-ish model makes mistakes: the comparison is not vacuous


# --- the checks fail when they should ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny() -> Encoder:
    from gte_pro import packaged_minilm_path

    torch.manual_seed(0)
    return Encoder.load(packaged_minilm_path(), random_init_config={"hidden_size": 32, "num_hidden_layers": 1,
                                                                    "num_attention_heads": 2, "intermediate_size": 64})


def test_verify_export_refuses_other_weights_and_a_lost_normalisation(tiny: Encoder):
    import copy

    reference = tiny.encode(TEXTS)
    assert verify_export("same", reference, tiny.encode, TEXTS) > 0.9999
    perturbed = copy.deepcopy(tiny)
    with torch.no_grad():
        perturbed.backbone.embeddings.word_embeddings.weight.add_(0.05 * torch.randn_like(
            perturbed.backbone.embeddings.word_embeddings.weight))
    with pytest.raises(ExportMismatchError, match=r"perturbed export does not reproduce the module: cosine 0\.\d+"):
        verify_export("perturbed", reference, perturbed.encode, TEXTS)
    with pytest.raises(ExportMismatchError, match="relative norm difference"):
        verify_export("unnormalised", reference, lambda texts: 3 * tiny.encode(texts), TEXTS)
    with pytest.raises(ExportMismatchError, match=r"shape \(5, 16\), the module's are \(5, 32\)"):
        verify_export("truncated", reference, lambda texts: tiny.encode(texts)[:, :16], TEXTS)


def test_state_dict_round_trip_is_exact_and_catches_a_different_model(tiny: Encoder):
    from gte_pro import packaged_minilm_path

    config = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    fresh = Encoder.load(packaged_minilm_path(), random_init_config=config)
    assert state_dict_round_trip(tiny, fresh, TEXTS, tolerance=0.0) == 0.0
    cls_pooled = Encoder.load(packaged_minilm_path(), random_init_config=config, pooling="cls")
    with pytest.raises(ExportMismatchError, match="state-dict round trip changed the embeddings"):
        state_dict_round_trip(tiny, cls_pooled, TEXTS, tolerance=1e-6)


def _drifted(encoder: Encoder, size: float = 3e-3) -> Encoder:
    """A copy whose output layer is off by ``size``: a device whose kernels compute slightly differently."""
    import copy

    drifted = copy.deepcopy(encoder)
    with torch.no_grad():
        bias = drifted.backbone.encoder.layer[-1].output.LayerNorm.bias
        bias.add_(size * torch.linspace(-1, 1, len(bias)))
    return drifted


def test_device_comparison_measures_the_difference_and_refuses_it_above_the_tolerance(tiny: Encoder):
    drifted = _drifted(tiny)
    diff = compare_devices(tiny, drifted, TEXTS, tolerance=1.0)
    assert diff == pytest.approx(float((tiny.encode(TEXTS) - drifted.encode(TEXTS)).abs().max()))
    assert 1e-4 < diff < 1e-2  # a kernel-sized drift, not a different model
    with pytest.raises(ExportMismatchError, match=r"CPU and cuda embeddings differ: max abs diff \S+ > 1\.0e-04"):
        compare_devices(tiny, drifted, TEXTS, tolerance=1e-4)


def test_cpu_vs_device_compares_the_model_with_its_copy_on_the_device(tiny: Encoder, monkeypatch):
    """Through cpu_vs_device itself: a device copy that computes differently fails the check, the model is left
    as it was (dtype included), and without CUDA the check reports None."""
    import copy

    import gte_pro.export.verify as verify

    reference = tiny.encode(TEXTS)
    copies: list[str] = []
    real_copy = verify.device_copy

    def drifting_copy(encoder: Encoder, device: str) -> Encoder:
        copies.append(device)
        return _drifted(real_copy(encoder, device))

    monkeypatch.setattr(verify, "device_copy", drifting_copy)
    with pytest.raises(ExportMismatchError, match=r"CPU and cpu embeddings differ: max abs diff \S+ > 1\.0e-04"):
        cpu_vs_device(tiny, TEXTS, tolerance=1e-4, device="cpu")
    assert copies == ["cpu"]  # only the device side is a copy: the reference is the model itself
    torch.testing.assert_close(tiny.encode(TEXTS), reference, rtol=0, atol=0)
    monkeypatch.setattr(verify, "device_copy", real_copy)

    bf16 = copy.deepcopy(tiny).bfloat16()
    assert cpu_vs_device(bf16, TEXTS, tolerance=0.0, device="cpu") == 0.0  # both sides in fp32
    assert next(bf16.parameters()).dtype == torch.bfloat16  # the caller's model is not converted in place
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cpu_vs_device(tiny, TEXTS, tolerance=1e-4) is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cpu_vs_gpu_embeddings_agree(tiny: Encoder):
    diff = cpu_vs_device(tiny, TEXTS, tolerance=1e-4)
    print(f"CPU vs GPU max abs diff: {diff:.3e}")
    assert diff is not None and diff <= 1e-4


def test_missing_onnx_packages_fail_before_training(monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name))
    with pytest.raises(ImportError, match=r"export\.onnx=true needs onnxruntime: pip install -e '\.\[export\]'"):
        check_export_requirements({"onnx": True})
    check_export_requirements({"onnx": False})


def test_a_mismatching_export_fails_the_run(make_cfg, tmp_path, monkeypatch, pairs_file):
    import gte_pro.export.release

    # an HF export whose loader drops the normalisation, as a wrong gte_pro_pooling.json would
    real = gte_pro.export.release.hf_embedder
    monkeypatch.setattr(gte_pro.export.release, "hf_embedder", lambda folder: lambda texts: 2 * real(folder)(texts))
    cfg = make_cfg(["debug=fast", "logger=none", "callbacks=none", "data=jsonl", f"data.train_file={pairs_file}",
                    "data.val_fraction=0.2", "export.hf=true"], output_dir=tmp_path / "bad")
    with pytest.raises(ExportMismatchError, match="Hugging Face export does not reproduce the module"):
        train(cfg)


@pytest.mark.parametrize("folder", ["model", "hf"])
def test_exports_load_with_every_weight_of_their_architecture(release_run, folder):
    """No "pooler ... MISSING, newly initialized" report for a user who loads the export with AutoModel."""
    from transformers import AutoModel

    _, run, _ = release_run
    _, info = AutoModel.from_pretrained(str(run / folder), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
