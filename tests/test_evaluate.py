"""`mode=eval`: BEIR numbers equal sentence-transformers' evaluator, encoding runs in inference mode and the
trainer's precision, and 2 DDP processes (corpus sharded) give the 1-process numbers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gte_pro.data.beir import load_beir
from gte_pro.models.encoder import Encoder
from gte_pro.retrieval import RetrievalSet
from gte_pro.train import train
from tests.beir_data import st_evaluator_metrics, write_beir_folder
from tests.conftest import REPO


@pytest.fixture
def beir_dir(tmp_path: Path) -> Path:
    return write_beir_folder(tmp_path / "scifake")


def test_packaged_minilm_matches_sentence_transformers_evaluator(make_cfg, beir_dir: Path, tmp_path: Path):
    from sentence_transformers import SentenceTransformer

    from gte_pro import packaged_minilm_path

    other = {"path": str(beir_dir), "split": "dev", "name": "scifake_dev"}
    cfg = make_cfg(["mode=eval", "model=minilm", "data.max_length=256",
                    f"eval.beir=[{beir_dir},{{path: {other['path']}, split: dev, name: scifake_dev}}]"],
                   output_dir=tmp_path / "eval")
    assert train(cfg) is None  # no held-out split in eval mode: val/ndcg@10 does not exist
    report = json.loads((tmp_path / "eval" / "metrics.json").read_text())
    model = SentenceTransformer(packaged_minilm_path(), device="cpu")
    model.max_seq_length = 256
    for name, split in (("scifake", "test"), ("scifake_dev", "dev")):
        ours = report["sets"][name]
        assert ours["split"] == split and ours["queries"] == len(load_beir(beir_dir, split).queries)
        assert ours["metrics"] == pytest.approx(st_evaluator_metrics(model, load_beir(beir_dir, split)), abs=1e-4)
    assert report["model"] == packaged_minilm_path() and report["texts_per_s"] > 0
    table = (tmp_path / "eval" / "metrics.md").read_text()
    assert "| scifake | 8 | 36 |" in table and "| scifake_dev | 6 | 36 |" in table


def test_encoding_runs_in_inference_mode_and_the_trainers_precision(make_cfg, beir_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, tokenizer):
    seen: list[tuple[bool, bool]] = []
    masks: list[torch.Tensor] = []
    forward = Encoder.forward

    def spy(self, input_ids, attention_mask, **extra):
        seen.append((torch.is_inference_mode_enabled(), torch.is_autocast_enabled("cpu")))
        masks.append(attention_mask)
        return forward(self, input_ids, attention_mask, **extra)

    monkeypatch.setattr(Encoder, "forward", spy)
    # documents of 1 to 4 times their length, in file order: batches in that order would be mostly padding
    docs = [json.loads(line) for line in (beir_dir / "corpus.jsonl").read_text().splitlines()]
    (beir_dir / "corpus.jsonl").write_text("".join(json.dumps({**d, "text": " ".join([d["text"]] * (1 + i % 4))})
                                                   + "\n" for i, d in enumerate(docs)))
    cfg = make_cfg(["mode=eval", "model=tiny", "precision=bf16-mixed", "eval.batch_size=8", f"eval.beir=[{beir_dir}]"],
                   output_dir=tmp_path / "bf16")
    train(cfg)
    assert len(seen) == 6 and all(inference and autocast for inference, autocast in seen)  # 44 texts / 8
    assert json.loads((tmp_path / "bf16" / "metrics.json").read_text())["precision"] == "bf16-mixed"
    # texts sorted by token count before batching: far less padding than batches in file order
    beir = load_beir(beir_dir, "test")
    in_file_order = [tokenizer(chunk, padding=True, truncation=True, max_length=cfg.eval.max_length)["attention_mask"]
                     for texts in (beir.queries, beir.corpus)
                     for chunk in (texts[i : i + 8] for i in range(0, len(texts), 8))]
    real = sum(sum(map(sum, m)) for m in in_file_order)
    unsorted_share = real / sum(len(m) * len(m[0]) for m in in_file_order)
    sorted_share = float(sum(m.sum() for m in masks)) / sum(m.numel() for m in masks)
    assert float(sum(m.sum() for m in masks)) == real
    assert sorted_share > 0.85 and sorted_share > unsorted_share + 0.2, (sorted_share, unsorted_share)


def test_prefixes_from_the_model_config_reach_queries_and_documents(make_cfg, beir_dir: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch, tokenizer):
    from gte_pro.data.corpus_store import CorpusStore
    from gte_pro.data.datasets import TokenizedTexts

    texts: list[str] = []  # the queries, tokenized when the evaluation starts
    tokenize = TokenizedTexts.__init__
    monkeypatch.setattr(TokenizedTexts, "__init__",
                        lambda self, tokenizer, items, *args: texts.extend(items) or tokenize(self, tokenizer, items,
                                                                                               *args))
    cfg = make_cfg(["mode=eval", "model=tiny", "model.query_prefix='query: '", "model.doc_prefix='passage: '",
                    f"eval.beir=[{beir_dir}]"], output_dir=tmp_path / "prefixed")
    train(cfg)
    assert len(texts) == 8 and all(t.startswith("query: ") for t in texts)
    # the documents were tokenized once into the corpus store, with the prefix
    (store,) = [s for s in map(CorpusStore, Path(cfg.paths.cache_dir).expanduser().glob("corpora/*"))
                if s.meta["corpus"] == str(beir_dir / "corpus.jsonl")]
    assert store.meta["doc_prefix"] == "passage: " and len(store) == 36
    assert all(tokenizer.decode(store[j][1:3]) == "passage :" for j in range(len(store)))


def test_without_beir_sets_the_data_modules_held_out_split_is_evaluated(make_cfg, tmp_path: Path):
    cfg = make_cfg(["mode=eval", "debug=fast", "eval.quantization=[int8,binary]"], output_dir=tmp_path / "heldout")
    value = train(cfg)
    report = json.loads((tmp_path / "heldout" / "metrics.json").read_text())
    metrics = report["sets"]["held-out"]["metrics"]
    assert value == pytest.approx(metrics["ndcg@10"])
    assert report["sets"]["held-out"]["queries"] == 32
    # quantized NDCG@10 next to float32's, in the json and the table
    assert 0 <= metrics["ndcg@10_binary"] <= 1 and 0 <= metrics["ndcg@10_int8"] <= 1  # values: test_sharded_eval
    header = next(line for line in (tmp_path / "heldout" / "metrics.md").read_text().splitlines()
                  if line.startswith("| set"))
    assert header.rstrip(" |").endswith("ndcg@10_int8 | ndcg@10_binary")


def test_a_misspelt_optimized_metric_of_eval_mode_is_an_error(make_cfg, tmp_path: Path):
    cfg = make_cfg(["mode=eval", "debug=fast", "optimized_metric=val/ndgc@10"], output_dir=tmp_path / "typo")
    with pytest.raises(ValueError, match=r"optimized_metric='val/ndgc@10' is not a metric of this run; valid "
                                         r"choices: .*val/ndcg@10"):
        train(cfg)


def test_unknown_mode_names_the_choices(make_cfg):
    with pytest.raises(ValueError, match="mode='predict': valid choices: train, eval, mine, score"):
        train(make_cfg(["mode=predict"]))


def test_two_ddp_processes_give_the_one_process_numbers(make_cfg, beir_dir: Path, tmp_path: Path, cache_dir: Path):
    """`python train.py mode=eval strategy=ddp devices=2`: each rank encodes half the texts, top-k lists merge."""
    overrides = ["mode=eval", "model=tiny", "eval.batch_size=4", f"eval.beir=[{beir_dir}]"]
    train(make_cfg(overrides, output_dir=tmp_path / "one"))
    one = json.loads((tmp_path / "one" / "metrics.json").read_text())
    cmd = [sys.executable, "train.py", *overrides, "strategy=ddp", "devices=2", f"hydra.run.dir={tmp_path / 'two'}",
           f"paths.cache_dir={cache_dir}"]
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "HF_HUB_OFFLINE": "1"}, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    two = json.loads((tmp_path / "two" / "metrics.json").read_text())
    assert two["world_size"] == 2 and one["world_size"] == 1
    assert two["sets"]["scifake"]["metrics"] == pytest.approx(one["sets"]["scifake"]["metrics"], abs=1e-6)
    assert 0.0 < one["sets"]["scifake"]["metrics"]["ndcg@10"] < 1.0


def test_pre_tokenized_batches_equal_the_tokenizers_own_padding(tokenizer):
    from gte_pro.data.collate import EvalCollator
    from gte_pro.data.datasets import EvalTexts

    corpus = ["a short one", "a much longer document " * 40, "", "mid length text about sorting things"]
    retrieval = RetrievalSet(queries=["what sorts?", "q"], corpus=corpus, relevant=[{3}, {0}])
    dataset = EvalTexts(retrieval, tokenizer, max_length=16, query_prefix="query: ", doc_prefix="doc: ")
    items = [dataset[i] for i in range(len(dataset))]
    # queries, then documents (a rank's corpus shard is one slice of its rows), each longest first, truncated
    assert [i >= 0 for i, _ in items] == [True, True, False, False, False, False]
    for part in (items[:2], items[2:]):
        lengths = [len(tokens) for _, tokens in part]
        assert lengths == sorted(lengths, reverse=True) and max(lengths) <= 16
    assert max(len(tokens) for _, tokens in items) == 16
    batch = EvalCollator(tokenizer)(items)
    texts = {i: "query: " + q for i, q in enumerate(retrieval.queries)}
    texts |= {-(j + 1): "doc: " + d for j, d in enumerate(corpus)}
    expected = tokenizer([texts[i] for i in batch["ids"].tolist()], padding=True, truncation=True, max_length=16,
                         return_tensors="pt")
    assert sorted(batch["ids"].tolist()) == [-4, -3, -2, -1, 0, 1]
    assert batch["features"].keys() == expected.keys()
    for key in expected:
        assert torch.equal(batch["features"][key], expected[key]), key


def test_a_run_tokenizes_its_validation_texts_once_and_validates_each_weights_once(make_cfg, tmp_path: Path,
                                                                                  monkeypatch: pytest.MonkeyPatch):
    from gte_pro.data.datasets import TokenizedTexts
    from gte_pro.training.module import ContrastiveModule

    sizes: list[int] = []
    tokenize = TokenizedTexts.__init__
    monkeypatch.setattr(TokenizedTexts, "__init__",
                        lambda self, tokenizer, texts, *args: sizes.append(len(texts)) or tokenize(self, tokenizer,
                                                                                                   texts, *args))
    validations: list[int] = []
    epoch_end = ContrastiveModule.on_validation_epoch_end
    monkeypatch.setattr(ContrastiveModule, "on_validation_epoch_end",
                        lambda self: validations.append(self.global_step) or epoch_end(self))
    cfg = make_cfg(["debug=fast", "trainer.max_epochs=2", "callbacks.early_stopping=null", "logger=none"],
                   output_dir=tmp_path / "run")
    train(cfg)
    report = json.loads((tmp_path / "run" / "metrics.json").read_text())
    # the held-out split's queries and corpus (1,266 documents, plus the 64 training rows' positives as
    # distractors: data.val_distractors), tokenized for the first validation only
    assert sizes == [32, 1266 + 64]
    # before training, after each of the 2 epochs (4 steps each); the best checkpoint is one of those weights
    assert validations == [0, 4, 8]
    assert int(Path(report["best_checkpoint"]).stem.split("step")[-1]) in (4, 8)
