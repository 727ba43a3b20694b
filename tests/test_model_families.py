"""Model families beyond BERT: randomly initialised configs of any architecture, decoder embedders (last-token
pooling with either padding, the EOS appended, instructions) and ModernBERT, trained and exported offline."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import torch

from gte_pro import packaged_minilm_path
from gte_pro.data.cache import tokenizer_fingerprint
from gte_pro.errors import ConfigError
from gte_pro.models.encoder import Encoder
from gte_pro.models.loading import append_eos, random_config
from gte_pro.models.pooling import pool
from gte_pro.models.tiny_tokenizer import EOS, tiny_bpe_tokenizer
from gte_pro.train import train

QWEN2 = {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 2, "intermediate_size": 64, "max_position_embeddings": 256}
BERT = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64}
TEXTS = ["how do I sort a list", "sorted(iterable) returns a new sorted list from the items of iterable",
         "open a file", "a dictionary maps keys to values; d.get(key, default) reads one"]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_bpe_tokenizer(tmp_path_factory.mktemp("bpe"))


def test_random_init_config_builds_the_named_architecture(tokenizer):
    assert type(random_config(tokenizer, {"hidden_size": 32})).__name__ == "BertConfig"
    config = random_config(tokenizer, QWEN2)
    assert type(config).__name__ == "Qwen2Config" and config.vocab_size == len(tokenizer)
    assert config.pad_token_id == tokenizer.pad_token_id and config.eos_token_id == tokenizer.sep_token_id
    with pytest.raises(ConfigError, match="model.random_init_config.model_type='qwen9'"):
        random_config(tokenizer, {"model_type": "qwen9"})


def test_last_token_pooling_reads_the_last_real_token_with_either_padding():
    hidden = torch.arange(2 * 4, dtype=torch.float32).view(2, 4, 1)
    right = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    left = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]])
    assert pool(hidden, right, "last").flatten().tolist() == [1.0, 7.0]
    assert pool(hidden, left, "last").flatten().tolist() == [3.0, 7.0]


@pytest.mark.parametrize("kind", ["qwen2", "bert"])
def test_left_and_right_padding_give_the_same_embeddings(kind: str, bpe: str):
    """A decoder (rotary positions) and BERT (absolute positions: the encoder counts positions over the real
    tokens), each text in a padded batch as alone."""
    name, fields = (bpe, QWEN2) if kind == "qwen2" else (packaged_minilm_path(), BERT)
    embeddings = {}
    for side in ("left", "right"):
        torch.manual_seed(0)
        encoder = Encoder.load(name, random_init_config=fields, pooling="last", padding_side=side, max_length=64,
                               length_chunks=1).eval()
        embeddings[side] = encoder.encode(TEXTS, batch_size=4)
        alone = torch.cat([encoder.encode([text]) for text in TEXTS])
        torch.testing.assert_close(embeddings[side], alone, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(embeddings["left"], embeddings["right"], rtol=1e-4, atol=1e-5)


def test_append_eos_ends_every_text_with_it_once(bpe: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(bpe)
    before = tokenizer_fingerprint(tokenizer)
    assert tokenizer("open a file")["input_ids"][-1] != tokenizer.eos_token_id
    assert append_eos(tokenizer) is True and append_eos(tokenizer) is False  # once
    ids = tokenizer(["open a file", "x"])["input_ids"]
    assert all(row[-1] == tokenizer.convert_tokens_to_ids(EOS) for row in ids)
    assert tokenizer.convert_ids_to_tokens(ids[1]).count(EOS) == 1
    # the token cache's key sees the change: a cache built without the EOS is not reused
    assert tokenizer_fingerprint(tokenizer) != before
    # BERT ends a text with [SEP], which plays the EOS's part: nothing to add
    bert = AutoTokenizer.from_pretrained(packaged_minilm_path())
    assert append_eos(bert) is False


@pytest.mark.parametrize("model", ["tiny_qwen2", "tiny_modernbert"])
def test_decoder_and_modernbert_train_and_export_offline(make_cfg, tmp_path: Path, model: str):
    """`python train.py debug=fast model=tiny_qwen2` (and ModernBERT): trains, validates, and its
    sentence-transformers and Hugging Face exports reproduce the module's embeddings (checked by the run)."""
    out = tmp_path / model
    cfg = make_cfg(["debug=fast", f"model={model}", "logger=none"], output_dir=out)
    if model == "tiny_qwen2":  # an instruction before each query, none before documents
        assert cfg.model.query_prefix.startswith("Instruct: ") and cfg.model.doc_prefix == ""
    train(cfg)
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["global_step"] == 4 and "val/ndcg@10" in metrics["val"]
    assert min(metrics["exports"]["min_cosine"].values()) >= 0.9999
    architecture = json.loads((out / "model" / "config.json").read_text())["model_type"]
    assert architecture == {"tiny_qwen2": "qwen2", "tiny_modernbert": "modernbert"}[model]
    assert math.isfinite(metrics["train"]["train/loss"])


def test_each_source_of_a_mix_can_carry_its_own_query_instruction(tmp_path: Path, tokenizer):
    """data=mix with data.sources.<name>.query_prefix: that source's queries (training and validation) start with
    its instruction, the others with the model's."""
    from tests.test_mix import _module, _write_sources

    sources = _write_sources(tmp_path / "mix")
    sources["cook"]["query_prefix"] = "Instruct: find a recipe\nQuery: "
    module = _module(sources, tokenizer, query_prefix="query: ")
    instruction = {"cook": tokenizer("Instruct: find a recipe\nQuery:")["input_ids"][1:-1],
                   "sail": tokenizer("query:")["input_ids"][1:-1]}
    for name, source in module.sources.items():
        cached = source.token_cache.token_rows()[0]["query"]
        assert cached[1 : 1 + len(instruction[name])] == instruction[name], name
    loaders = module.val_dataloader()
    for loader, name in zip(loaders, module.sources, strict=True):
        query_ids = next(tokens for signed, tokens in loader.dataset if signed >= 0)
        assert list(query_ids[1 : 1 + len(instruction[name])]) == instruction[name], name


# --- the decoder under DDP and FSDP, and resumed ------------------------------------------------------------------
STRATEGIES = {"one": ["data.batch_size=8"], "ddp": ["strategy=ddp", "devices=2", "data.batch_size=4"],
              "fsdp": ["strategy=fsdp", "devices=2", "data.batch_size=4"]}


def _last_weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_qwen2", "tiny_modernbert"])
def test_a_model_trains_alike_on_one_process_under_ddp_and_under_fsdp(tmp_path: Path, cache_dir: Path, model: str):
    """`model=tiny_qwen2` (and ModernBERT) through train.py: one process on batch 8, and 2 gloo ranks on 4 rows each of
    the same global batches, with DDP and with FSDP (each Qwen2 or ModernBERT layer its own shard unit). The first
    step's loss and gradients of DDP are one process's; after 4 AdamW steps all three hold the same weights (Adam
    moves every weight by ~lr = 1e-3 a step, 1,000x the tolerance) and validate alike; the FSDP run exports full
    weights that reproduce it."""
    import subprocess
    import sys

    from tests.conftest import REPO

    # a random tiny ModernBERT's CLS is nearly the same for every text (the loss is ln 8): its gradients would be
    # fp32 cancellation noise, so its runs compare mean pooling
    pooling = ["model.pooling=mean"] if model == "tiny_modernbert" else []
    runs = {}
    for name, overrides in STRATEGIES.items():
        run, probe = tmp_path / name, tmp_path / f"{name}_probe"
        cmd = [sys.executable, "train.py", "debug=fast", f"model={model}", *pooling, "trainer.precision=32-true",
               "logger=none", "callbacks.progress_bar=null", "export.hf=false",
               "+callbacks.probe._target_=tests.probes.FirstStepProbe",
               f"+callbacks.probe.out_dir={probe}", f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}", *overrides]
        proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        runs[name] = run
        if name != "fsdp":  # FSDP's ranks hold shards of the gradients, not the gradients
            ranks = [torch.load(path) for path in sorted(probe.glob("rank*.pt"))]
            runs[f"{name}_probe"] = ranks
    (one,), ddp = runs["one_probe"], runs["ddp_probe"]
    assert float(sum(rank["loss"] for rank in ddp) / 2) == pytest.approx(float(one["loss"]), rel=1e-5)
    for rank in ddp:
        for name, grad in one["grads"].items():
            # fp32 sums in another order: within 1e-5 of each gradient's own scale
            torch.testing.assert_close(rank["grads"][name], grad, rtol=0, atol=1e-5 * float(grad.abs().max()),
                                       msg=name)
    weights = {name: _last_weights(runs[name]) for name in STRATEGIES}
    for name in ("ddp", "fsdp"):
        assert weights[name].keys() == weights["one"].keys()
        for key, value in weights["one"].items():
            torch.testing.assert_close(weights[name][key], value, rtol=0, atol=5e-5, msg=f"{name}: {key}")
    metrics = {name: json.loads((runs[name] / "metrics.json").read_text()) for name in STRATEGIES}
    assert metrics["fsdp"]["world_size"] == 2 and metrics["fsdp"]["global_step"] == 4
    for key, value in metrics["one"]["val"].items():
        assert metrics["fsdp"]["val"][key] == pytest.approx(value, abs=1e-4), key
    assert metrics["fsdp"]["parameters"] == metrics["one"]["parameters"]  # counted on the full weights, not shards
    assert min(metrics["fsdp"]["exports"]["min_cosine"].values()) >= 0.9999


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny_qwen2", "tiny_modernbert"])
def test_a_stopped_run_resumes_to_bit_identical_weights(make_cfg, tmp_path: Path, model: str):
    from tests.test_resume import RUN, stop_at_step_7_and_resume

    stop_at_step_7_and_resume(make_cfg, tmp_path, [*RUN, f"model={model}"])


def test_fsdp_makes_each_hugging_face_block_its_own_shard_unit(bpe: str):
    from gte_pro.launch.fsdp import no_split_layer_classes

    qwen2 = Encoder.load(bpe, random_init_config=QWEN2, pooling="last", max_length=32)
    bert = Encoder.load(packaged_minilm_path(), random_init_config=BERT, max_length=32)
    assert {cls.__name__ for cls in no_split_layer_classes(qwen2)} == {"Qwen2DecoderLayer"}
    assert {cls.__name__ for cls in no_split_layer_classes(bert)} == {"BertEmbeddings", "BertLayer"}


def test_fsdp_wraps_lora_adapters_apart_from_their_frozen_layers(bpe: str):
    from gte_pro.launch.fsdp import layer_policy

    encoder = Encoder.load(bpe, random_init_config=QWEN2, pooling="last", max_length=32, lora={"r": 4})
    policy = layer_policy(encoder)
    wrapped = {name for name, module in encoder.named_modules()
               if name and policy(module=module, recurse=False, nonwrapped_numel=1)}
    assert "backbone.base_model.model.layers.0" in wrapped
    assert "backbone.base_model.model.layers.0.self_attn.q_proj.lora_A.default" in wrapped
    assert not any(name.endswith(("q_proj.base_layer", "embed_tokens")) for name in wrapped)  # frozen: in their block


@pytest.mark.parametrize("model", ["tiny_qwen2", "tiny_modernbert"])
def test_the_loss_falls_on_the_demo_data(make_cfg, tmp_path: Path, model: str):
    """5 epochs over 32 demo pairs (20 steps, logged each step): the last epoch's mean loss is well below the first's.
    The decoder trains with LoRA, gradient checkpointing and GradCache on, in bf16 autocast."""
    import csv

    options = ["model.gradient_checkpointing=true", "loss.mini_batch_size=4",
               "model.lora={r: 8, alpha: 16, dropout: 0.0}", "model.lr=5e-3", "trainer.precision=bf16-mixed",
               ] if model == "tiny_qwen2" else [
                   "model.pooling=mean"]  # a random tiny ModernBERT's CLS starts the same for every text
    out = tmp_path / model
    train(make_cfg(["debug=fast", f"model={model}", "logger=csv", "trainer.log_every_n_steps=1",
                    "trainer.limit_train_batches=null", "data.max_train_rows=32", "trainer.max_epochs=5",
                    "trainer.max_steps=-1", "eval.before=false", "export.hf=false", "callbacks.early_stopping=null",
                    *options], output_dir=out))
    rows = list(csv.DictReader((out / "csv" / "version_0" / "metrics.csv").open()))
    losses = [float(row["train/loss"]) for row in rows if row.get("train/loss")]
    assert len(losses) == 20, len(losses)
    first, last = sum(losses[:4]) / 4, sum(losses[-4:]) / 4
    assert last < 0.7 * first, (first, last)


def test_re_mining_under_fsdp_is_refused_with_what_works(make_cfg):
    """Re-mining embeds the corpus outside the training step, where each FSDP rank holds only shards."""
    from gte_pro.config.checks import check_config

    with pytest.raises(ConfigError, match=r"data.remine: not supported with strategy=fsdp .* use strategy=ddp"):
        check_config(make_cfg(["strategy=fsdp", "devices=2", "data.num_negatives=1", "data.remine.every_n_epochs=1"]))
    check_config(make_cfg(["strategy=ddp", "devices=2", "data.num_negatives=1", "data.remine.every_n_epochs=1"]))
