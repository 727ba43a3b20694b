"""The projection head (GTE-Pro's hidden -> 512 -> ReLU -> dropout -> 512): trained on top of pooling, exported as
sentence-transformers Dense modules, in the plain HF layout's documented code and in ONNX, each verified."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro.models.encoder import Encoder
from gte_pro.models.heads import build_projection
from gte_pro.train import train
from gte_pro.training.module import ContrastiveModule

TEXTS = ["How do I sort a dictionary by value?", "Return a new list containing all items in ascending order."]


def test_the_head_is_linear_activation_dropout_then_linear():
    head = build_projection(64, {"dims": [32, 16], "activation": "relu", "dropout": 0.1})
    assert [type(m).__name__ for m in head] == ["Linear", "ReLU", "Dropout", "Linear"]
    assert (head[0].in_features, head[0].out_features, head[3].out_features) == (64, 32, 16)
    with pytest.raises(ValueError, match=r"model.projection.activation='swish' is not valid; valid choices: relu"):
        build_projection(64, {"dims": [32], "activation": "swish"})
    with pytest.raises(ValueError, match=r"model.projection.dims=\[\]: expected a list of positive integers"):
        build_projection(64, {"dims": []})


def test_a_run_with_the_head_exports_it_everywhere_verified(make_cfg, tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    cfg = make_cfg(["debug=fast", "logger=none", "model.projection={dims: [32, 16], dropout: 0.1}",
                    "export.onnx=true"], output_dir=tmp_path / "run")
    train(cfg)
    run = tmp_path / "run"
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics["exports"]["min_cosine"]) == {"sentence_transformers", "hf", "onnx"}
    assert min(metrics["exports"]["min_cosine"].values()) >= 0.9999
    modules = json.loads((run / "model" / "modules.json").read_text())
    assert [m["type"].rsplit(".", 1)[-1] for m in modules] == ["Transformer", "Pooling", "Dense", "Dense",
                                                                "Normalize"]
    assert json.loads((run / "model" / "2_Dense" / "config.json").read_text())["activation_function"].endswith("ReLU")
    model = SentenceTransformer(str(run / "model"), device="cpu")
    # renamed get_embedding_dimension in recent releases; older ones (>= 3.0 is allowed) have only the old name
    dimension = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
    assert dimension() == 16
    module = ContrastiveModule.load_from_checkpoint(metrics["best_checkpoint"])
    assert module.encoder.dim == 16 and module.encoder.hidden_dim == 64
    ours = module.encoder.encode(TEXTS)
    theirs = model.encode(TEXTS, convert_to_tensor=True).cpu()
    torch.testing.assert_close(theirs, ours, atol=1e-5, rtol=1e-4)
    assert "projection head" in (run / "model" / "README.md").read_text()


def test_the_head_trains(make_cfg, tmp_path: Path):
    from gte_pro.modes.build import build_encoder, seed_and_precision

    cfg = make_cfg(["debug=fast", "logger=none", "callbacks=none", "model.projection={dims: [16]}",
                    "export.hf=false", "+trainer.enable_checkpointing=false"], output_dir=tmp_path / "run")
    seed_and_precision(cfg)  # what train() does first: the same seed gives the same initial head
    initial = build_encoder(cfg).projection[0].weight.detach().clone()
    train(cfg)
    # model=encoder model.name_or_path=<run>/model (evaluating, mining with or fine-tuning a run) keeps its head
    exported = Encoder.load(str(tmp_path / "run" / "model"))
    trained = exported.projection[0].weight.detach()
    assert exported.dim == 16 and trained.shape == initial.shape == (16, 64)
    assert not torch.allclose(trained, initial)  # the head was trained, not exported as initialised
    from sentence_transformers import SentenceTransformer

    theirs = SentenceTransformer(str(tmp_path / "run" / "model"), device="cpu").encode(TEXTS, convert_to_tensor=True)
    torch.testing.assert_close(exported.encode(TEXTS), theirs.cpu(), atol=1e-5, rtol=1e-4)
