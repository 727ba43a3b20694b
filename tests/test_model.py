"""Encoder: pooling, settings read from the sentence-transformers files, agreement with sentence-transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.models.encoder import Encoder
from gte_pro.models.pooling import detect_pooling, pool


def test_pooling_modes_ignore_padding():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, mask, "cls"), hidden[:, 0])
    torch.testing.assert_close(pool(hidden, mask, "mean")[0], hidden[0, :2].mean(0))
    torch.testing.assert_close(pool(hidden, mask, "last"), torch.stack([hidden[0, 1], hidden[1, 2]]))
    left_padded = torch.tensor([[0, 1, 1], [1, 1, 1]])
    torch.testing.assert_close(pool(hidden, left_padded, "last"), hidden[:, 2])
    with pytest.raises(ValueError, match="valid choices: mean, cls, last"):
        pool(hidden, mask, "max")


def test_pooling_and_normalisation_are_read_from_sentence_transformers_files(tmp_path: Path):
    assert detect_pooling(packaged_minilm_path()) == ("mean", True)
    (tmp_path / "1_Pooling").mkdir()
    (tmp_path / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode": "cls"}))  # ST >= 6 layout
    (tmp_path / "modules.json").write_text(json.dumps([{"type": "x.Transformer"}, {"type": "x.Pooling"}]))
    assert detect_pooling(str(tmp_path)) == ("cls", False)
    assert detect_pooling(str(tmp_path / "missing")) == (None, None)


def test_packaged_minilm_matches_sentence_transformers():
    from sentence_transformers import SentenceTransformer

    texts = ["How do I reverse a list in Python?", "list.reverse() reverses the items of the list in place.", "x"]
    ours = Encoder.load(packaged_minilm_path(), max_length=256).encode(texts)
    theirs = SentenceTransformer(packaged_minilm_path(), device="cpu").encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(ours, theirs.cpu(), atol=1e-5, rtol=1e-4)


def test_tiny_random_bert_uses_the_packaged_tokenizer():
    tiny = Encoder.load(packaged_minilm_path(), random_init_config={"hidden_size": 32, "num_hidden_layers": 1,
                                                                    "num_attention_heads": 2, "intermediate_size": 64})
    from transformers import AutoTokenizer

    texts = ["a", "b c d", "Grüße, naïve café: tokenizers differ here"]
    packaged = AutoTokenizer.from_pretrained(packaged_minilm_path())
    assert tiny.tokenize(texts)["input_ids"].tolist() == packaged(texts, padding=True)["input_ids"]
    # its embedding table covers exactly the tokenizer's vocabulary (every id it makes has a row)
    assert tiny.backbone.get_input_embeddings().num_embeddings == len(packaged)
    out = tiny.encode(texts)
    assert out.shape == (3, 32)
    torch.testing.assert_close(out.norm(dim=-1), torch.ones(3))
    assert tiny.backbone.config.num_hidden_layers == 1 and tiny.training  # trains with dropout


def test_building_an_encoder_takes_cudnn_out_of_the_attention_backends():
    # cuDNN's SDPA plans every new (rows, length) shape (~0.5 s each on an H200): fatal with dynamic padding
    before = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(True)
    try:
        Encoder.load(packaged_minilm_path(), random_init_config={"hidden_size": 32, "num_hidden_layers": 1,
                                                                 "num_attention_heads": 2, "intermediate_size": 64})
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        assert torch.backends.cuda.mem_efficient_sdp_enabled() and torch.backends.cuda.flash_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


def test_bad_pooling_names_the_choices():
    with pytest.raises(ValueError, match="model.pooling='max' is not valid; valid choices: mean, cls, last"):
        Encoder.load(packaged_minilm_path(), pooling="max")


def test_gradient_checkpointing_gives_the_same_loss_and_gradients():
    """Recomputing activations in backward must not change the training signal, dropout included."""
    config = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
    texts = ["a short one", "a somewhat longer text to encode here", "third"]

    def loss_and_grads(checkpointing: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        torch.manual_seed(0)
        encoder = Encoder.load(packaged_minilm_path(), random_init_config=config, gradient_checkpointing=checkpointing)
        backbone = encoder.backbone
        active = getattr(backbone, "is_activation_checkpointing", None)
        active = backbone.is_gradient_checkpointing if active is None else active
        assert active == checkpointing and backbone.training
        torch.manual_seed(1)  # the same dropout masks in both runs
        loss = encoder(**encoder.tokenize(texts)).pow(3).sum()
        loss.backward()
        return loss.detach(), [p.grad for p in encoder.parameters() if p.grad is not None]

    plain_loss, plain_grads = loss_and_grads(False)
    ckpt_loss, ckpt_grads = loss_and_grads(True)
    assert torch.allclose(plain_loss, ckpt_loss, atol=1e-6)
    assert len(plain_grads) == len(ckpt_grads) > 0
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(plain_grads, ckpt_grads, strict=True))


def test_the_encoder_is_composed_of_a_backbone_and_a_head():
    """``Encoder(backbone, head)`` from the parts that ``Encoder.load`` builds: the same weights under the names of
    before (backbone.*, projection.*; BERT's pooler set aside) and the same embeddings."""
    from transformers import AutoModel

    from gte_pro.models.backbone import Backbone
    from gte_pro.models.heads import EmbeddingHead

    config = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    torch.manual_seed(0)
    loaded = Encoder.load(packaged_minilm_path(), random_init_config=config, pooling="cls", projection={"dims": [8]})
    torch.manual_seed(0)
    backbone = Backbone.load(packaged_minilm_path(), AutoModel, trust_remote_code=False, attn_implementation="sdpa",
                             random_init_config=config).set_pooler_aside()
    head = EmbeddingHead.build(packaged_minilm_path(), 32, pooling="cls", normalize=None, projection={"dims": [8]},
                               read_files=False)
    composed = Encoder(backbone, head)
    ours, theirs = composed.state_dict(), loaded.state_dict()
    assert list(ours) == list(theirs) and all(torch.equal(ours[key], theirs[key]) for key in ours)
    assert {key.split(".")[0] for key in ours} == {"backbone", "projection"} and composed._spare_pooler
    assert not any("pooler" in key for key in ours)
    assert (composed.pooling, composed.normalize, composed.dim) == ("cls", True, 8)
    texts = ["a", "two words", "a somewhat longer text"]
    assert torch.equal(composed.encode(texts), loaded.encode(texts))
    with pytest.raises(TypeError, match=r"use Encoder.load\(name_or_path"):
        Encoder(packaged_minilm_path(), head)


def test_a_config_that_names_the_old_targets_still_builds_its_model():
    """Checkpoints written before the parts carry ``_target_: gte_pro.models.encoder.Encoder`` (or the
    CrossEncoder's) in their config: they build through the builders, and the task check reads them the same."""
    from hydra.utils import instantiate
    from omegaconf import OmegaConf

    from gte_pro.config.cross_keys import task_problems
    from gte_pro.models import model_options
    from gte_pro.models.cross_encoder import CrossEncoder

    config = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
    for old, kind, task in (("gte_pro.models.encoder.Encoder", Encoder, "embed"),
                            ("gte_pro.models.cross_encoder.CrossEncoder", CrossEncoder, "rerank")):
        options = {"_target_": old, "name_or_path": packaged_minilm_path(), "random_init_config": config, "lr": 1e-5}
        assert type(instantiate(model_options(options))) is kind
        assert not any(p.startswith("model:") for p in task_problems(OmegaConf.create({"task": task,
                                                                                        "model": options})))
