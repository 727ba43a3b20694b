"""LoRA (peft): only the adapters train; exports hold merged full weights that load without peft, and the adapter
alone puts the trained model back on its base model; checkpoints resume with the adapters."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro.models.encoder import Encoder
from gte_pro.train import train
from gte_pro.training.module import ContrastiveModule

TEXTS = ["How do I sort a dictionary by value?", "Return a new list containing all items in ascending order.",
         "A much longer passage " * 10]
LORA = "model.lora={r: 4, alpha: 8, dropout: 0.0}"


@pytest.fixture(scope="module")
def minilm_lora_run(tmp_path_factory, cache_dir):
    """3 steps of the packaged MiniLM with LoRA on 60 pairs, bf16-mixed, GradCache chunks of 4, ONNX export on."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from tests.conftest import CONF, write_jsonl

    out = tmp_path_factory.mktemp("lora")
    rows = [{"query": f"what is topic number {i}?", "positive": f"Topic {i} covers item {i} in depth."}
            for i in range(60)]
    data = write_jsonl(out / "pairs.jsonl", rows)
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=[
            "model=minilm", LORA, "data=jsonl", f"data.train_file={data}", "data.val_fraction=0.2",
            "data.batch_size=8", "data.max_length=32", "trainer.limit_train_batches=3", "logger=none",
            "callbacks=default", "precision=bf16-mixed", "loss.mini_batch_size=4", "model.lr=1e-3",
            "export.onnx=true"])
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.paths.output_dir = str(out / "run")
        cfg.paths.cache_dir = str(cache_dir)
    train(cfg)
    return cfg, out / "run"


def test_only_the_adapters_train(minilm_lora_run):
    cfg, run = minilm_lora_run
    module = ContrastiveModule.load_from_checkpoint(json.loads((run / "metrics.json").read_text())["best_checkpoint"])
    trainable = {name for name, p in module.encoder.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in name for name in trainable)
    total = sum(p.numel() for p in module.encoder.parameters())
    assert sum(p.numel() for p in module.encoder.parameters() if p.requires_grad) < 0.01 * total
    # metrics.json records the same counts: r=4 on query and value of 6 layers of width 384 = 6*2*4*(384+384)
    counts = json.loads((run / "metrics.json").read_text())["parameters"]
    assert counts == {"total": total, "trainable": 6 * 2 * 4 * (384 + 384)}
    # the base weights are the pretrained ones, untouched; the adapters moved
    base = Encoder.load(cfg.model.name_or_path)
    name = "encoder.layer.0.attention.self.query"
    merged_free = dict(module.encoder.backbone.named_parameters())
    torch.testing.assert_close(merged_free[f"base_model.model.{name}.base_layer.weight"],
                               dict(base.backbone.named_parameters())[f"{name}.weight"])
    assert merged_free[f"base_model.model.{name}.lora_B.default.weight"].abs().sum() > 0


def test_exports_hold_merged_weights_that_load_without_peft(minilm_lora_run):
    from safetensors import safe_open
    from sentence_transformers import SentenceTransformer

    _, run = minilm_lora_run
    metrics = json.loads((run / "metrics.json").read_text())
    assert min(metrics["exports"]["min_cosine"].values()) >= 0.9999  # sentence-transformers, hf and onnx verified
    assert set(metrics["exports"]["min_cosine"]) == {"sentence_transformers", "hf", "onnx"}
    assert metrics["exports"]["adapter"] == str(run / "adapter")
    with safe_open(str(run / "model" / "model.safetensors"), "pt") as weights:
        assert not [key for key in weights.keys() if "lora" in key]  # noqa: SIM118 - safe_open has no iterator
    module = ContrastiveModule.load_from_checkpoint(metrics["best_checkpoint"])
    ours = module.encoder.encode(TEXTS)
    theirs = SentenceTransformer(str(run / "model"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    assert torch.nn.functional.cosine_similarity(ours, theirs.cpu()).min() >= 0.9999


def test_the_adapter_alone_restores_the_model_on_its_base(minilm_lora_run):
    from peft import PeftModel
    from transformers import AutoModel

    cfg, run = minilm_lora_run
    assert json.loads((run / "adapter" / "adapter_config.json").read_text())["r"] == 4
    module = ContrastiveModule.load_from_checkpoint(json.loads((run / "metrics.json").read_text())["best_checkpoint"])
    restored = Encoder.load(cfg.model.name_or_path, max_length=cfg.data.max_length)
    base = AutoModel.from_pretrained(cfg.model.name_or_path)
    restored.backbone = PeftModel.from_pretrained(base, str(run / "adapter"))
    torch.testing.assert_close(restored.encode(TEXTS), module.encoder.encode(TEXTS), atol=1e-5, rtol=1e-4)


def test_a_lora_run_resumes_from_its_checkpoint(make_cfg, tmp_path: Path, pairs_file: Path):
    overrides = ["debug=fast", LORA, "logger=none", "data=jsonl", f"data.train_file={pairs_file}",
                 "data.val_fraction=0.2"]
    train(make_cfg([*overrides, "trainer.max_steps=2"], output_dir=tmp_path / "run"))
    train(make_cfg([*overrides, "trainer.max_steps=4", "trainer.max_epochs=2", "resume=force"],
                   output_dir=tmp_path / "run"))
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and metrics["resumed_from"].endswith("last.ckpt")


def test_unknown_lora_keys_name_the_valid_ones(make_cfg, tmp_path: Path):
    with pytest.raises(ValueError, match=r"model.lora=\{'rank': 4\}: unknown key\(s\) rank; valid keys: r, alpha, "
                                         r"dropout, target_modules"):
        train(make_cfg(["debug=fast", "model.lora={rank: 4}"], output_dir=tmp_path / "bad"))
