"""ONNX exports of the model families beyond BERT: a decoder embedder (left padding, EOS appended, an instruction
before each query, last-token pooling) and ModernBERT, trained with ``export.onnx=true`` and checked by the run and
here with onnxruntime itself; and ``model.attn_implementation=null`` for ModernBERT."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.models.encoder import Encoder, best_attention
from gte_pro.train import train

# lengths from 2 words to past max_length (truncated): every row of a batch padded differently
TEXTS = ["sort a list", "how do I read a file line by line in python without loading it all",
         "a dictionary maps keys to values; d.get(key, default) reads one, and d.setdefault(key, []) adds it. " * 12,
         "zip"]
MODERNBERT = {"model_type": "modernbert", "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 2,
              "intermediate_size": 128, "max_position_embeddings": 512, "global_attn_every_n_layers": 3,
              "local_attention": 16}


def _onnx_embed(onnx_path: Path, tokenizer_dir: Path, texts: list[str], max_length: int) -> tuple[np.ndarray, dict]:
    """onnxruntime's embeddings of ``texts`` as one padded batch, tokenized by the exported tokenizer as it is."""
    import onnxruntime
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="np")
    feeds = {key: batch[key].astype(np.int64) for key in ("input_ids", "attention_mask")}
    session = onnxruntime.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    return session.run(["embeddings"], feeds)[0], {"tokenizer": tokenizer, **feeds}


@pytest.mark.parametrize("model", ["tiny_qwen2", "tiny_modernbert"])
def test_decoder_and_modernbert_export_to_onnx_that_reproduces_the_module(make_cfg, tmp_path: Path, model: str):
    """`python train.py debug=fast model=<preset> export.onnx=true`: the run verifies its ONNX file (metrics.json);
    onnxruntime on a batch of texts of different lengths (left-padded for the decoder, each ending in its EOS, the
    queries after the instruction) gives the embeddings ``Encoder.encode`` gives."""
    out = tmp_path / model
    cfg = make_cfg(["debug=fast", f"model={model}", "logger=none", "export.hf=false", "export.onnx=true"],
                   output_dir=out)
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["exports"]["min_cosine"]["onnx"] >= 0.9999
    m = cfg.model
    encoder = Encoder.load(str(out / "model"), pooling=m.pooling, normalize=m.normalize, max_length=m.max_length,
                           padding_side=m.padding_side, append_eos=m.append_eos, length_chunks=1).eval()
    texts = [m.query_prefix + text for text in TEXTS[:2]] + [m.doc_prefix + text for text in TEXTS[2:]]
    theirs, batch = _onnx_embed(out / "model.onnx", out / "model", texts, m.max_length)
    lengths = batch["attention_mask"].sum(axis=1)
    assert len(set(lengths.tolist())) == len(texts) and lengths.max() == m.max_length  # one truncated
    if model == "tiny_qwen2":
        # the exported tokenizer pads on the left and ends every text with the EOS, as the module's does
        assert batch["tokenizer"].padding_side == "left" and (batch["attention_mask"][:, 0] == 0).sum() == 3
        assert (batch["input_ids"][:, -1] == batch["tokenizer"].eos_token_id).all()
    torch.testing.assert_close(torch.from_numpy(theirs), encoder.encode(texts, batch_size=2), rtol=1e-4, atol=1e-5)


def test_modernbert_local_attention_window_survives_the_onnx_trace(tmp_path: Path):
    """The graph is traced on two short texts, inside ModernBERT's 16-token window; texts far longer than the window
    must still be masked to it in the graph (not the full attention the short trace needed)."""
    from gte_pro.export.writers import export_onnx

    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=MODERNBERT, pooling="mean", max_length=96).eval()
    encoder.save(tmp_path / "model")
    path = export_onnx(encoder, tmp_path / "model.onnx")
    theirs, _ = _onnx_embed(path, tmp_path / "model", TEXTS, encoder.max_length)
    torch.testing.assert_close(torch.from_numpy(theirs), encoder.encode(TEXTS), rtol=1e-4, atol=1e-5)


def test_modernbert_attention_null_picks_per_device_and_precision(monkeypatch):
    assert best_attention("modernbert", "cpu", half=True) == "sdpa"
    assert best_attention("bert", "cuda", half=True) is None  # other models: their own default
    has_flash = importlib.util.find_spec("flash_attn") is not None
    assert best_attention("modernbert", "cuda", half=True) == ("flash_attention_2" if has_flash else "sdpa")
    assert best_attention("modernbert", "cuda", half=False) == "sdpa"  # flash kernels take no fp32
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "flash_attn"
                        else real(name, *a))
    assert best_attention("modernbert", "cuda", half=True) == "flash_attention_2"
    monkeypatch.undo()
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=MODERNBERT, attn_implementation=None,
                           max_length=32)
    encoder.backbone.set_attn_implementation("eager")
    encoder(**encoder.tokenize(["a pass on the CPU"]))
    assert encoder.backbone.config._attn_implementation == "sdpa"


def test_an_untraceable_attention_is_exported_through_sdpa(tmp_path: Path):
    """flex_attention (as flash_attention_2 on a GPU) cannot be traced to ONNX ops: the export traces the backbone on
    sdpa, which computes the same, and puts its attention back."""
    from gte_pro.export.writers import export_onnx

    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=MODERNBERT, max_length=96).eval()
    reference = encoder.encode(TEXTS)
    encoder.save(tmp_path / "model")
    encoder.backbone.set_attn_implementation("flex_attention")
    path = export_onnx(encoder, tmp_path / "model.onnx")
    assert encoder.backbone.config._attn_implementation == "flex_attention"
    theirs, _ = _onnx_embed(path, tmp_path / "model", TEXTS, encoder.max_length)
    torch.testing.assert_close(torch.from_numpy(theirs), reference, rtol=1e-4, atol=1e-5)
