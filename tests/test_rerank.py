"""task=rerank: pairs joined as the tokenizer joins them, the reranker's losses, its validation, a whole run with its
verified exports, exact resume, and the config's refusals."""

from __future__ import annotations

import json
import math
import random
from functools import partial
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from gte_pro import packaged_minilm_path
from gte_pro.config.defaults import default_loss
from gte_pro.errors import ConfigError
from gte_pro.export.writers import export_sentence_transformers
from gte_pro.models.cross_encoder import CrossEncoder
from gte_pro.models.encoder import Encoder
from gte_pro.models.pairs import PairTemplate
from gte_pro.retrieval import RetrievalSet, rank_corpus
from gte_pro.train import train
from gte_pro.training.rerank_validation import (
    gather_pair_scores,
    reranked,
    retriever_candidates,
    rows_candidates,
)
from tests.ddp_harness import two_ranks_and_one
from tests.test_resume import RUN, stop_at_step_7_and_resume

TINY = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 64}
WORDS = "the quick brown fox jumps over lazy dog python list dict tuple sorted open file".split()


def _texts(rng: random.Random, most: int) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(1, most)))


# --- pairs --------------------------------------------------------------------------------------------------------
def _roberta_like() -> PreTrainedTokenizerFast:
    """A fast tokenizer with XLM-R's pair layout (<s> A </s></s> B </s>, no token types), built offline."""
    vocab = {word: i + 4 for i, word in enumerate(WORDS)} | {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", pair="<s> $A </s> </s> $B </s>", special_tokens=[("<s>", 0), ("</s>", 2)])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   unk_token="<unk>", model_input_names=["input_ids", "attention_mask"])


@pytest.mark.parametrize("kind", ["bert", "roberta"])
def test_cached_texts_join_into_the_pair_the_tokenizer_makes(tokenizer, kind):
    """Every pair, cut or not, equals tokenizer(query, doc, truncation="longest_first"): ids and token types."""
    tok = tokenizer if kind == "bert" else _roberta_like()
    rng = random.Random(0)
    for max_length in (8, 9, 16, 33, 64):
        template = PairTemplate.from_tokenizer(tok, max_length)
        for _ in range(60):
            query, doc = _texts(rng, 30), _texts(rng, 40)
            expected = tok(query, doc, truncation="longest_first", max_length=max_length)
            ids, types = template.join(tok(query)["input_ids"], tok(doc)["input_ids"])
            assert ids == expected["input_ids"], (max_length, query, doc)
            if "token_type_ids" in expected:
                assert types == expected["token_type_ids"]


# --- losses -------------------------------------------------------------------------------------------------------
def test_listwise_loss_is_the_cross_entropy_of_each_group():
    logits = torch.tensor([[2.0, 0.0, 0.0], [0.0, 1.0, -1.0]], dtype=torch.float64)
    expected = (math.log(1 + 2 * math.exp(-2)) + math.log(1 + math.e + math.exp(-1))) / 2
    assert default_loss("listwise")(logits).loss.item() == pytest.approx(expected, rel=1e-9)
    tau = 0.5
    expected = (math.log(1 + 2 * math.exp(-2 / tau)) + math.log(1 + math.exp(1 / tau) + math.exp(-1 / tau))) / 2
    assert default_loss("listwise", temperature=tau)(logits).loss.item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ConfigError, match="data.num_negatives"):
        default_loss("listwise")(logits[:, :1])


def test_pointwise_loss_is_the_binary_cross_entropy_of_each_pair():
    logits = torch.tensor([[2.0, 0.0, -1.0]])

    def bce(x: float, label: int, weight: float = 1.0) -> float:
        p = 1 / (1 + math.exp(-x))
        return -(weight * label * math.log(p) + (1 - label) * math.log(1 - p))

    expected = (bce(2.0, 1) + bce(0.0, 0) + bce(-1.0, 0)) / 3
    assert default_loss("pointwise_bce")(logits).loss.item() == pytest.approx(expected, rel=1e-6)
    expected = (bce(2.0, 1, 2.0) + bce(0.0, 0) + bce(-1.0, 0)) / 3
    assert default_loss("pointwise_bce", pos_weight=2.0)(logits).loss.item() == pytest.approx(expected, rel=1e-6)


def _group_step(loss: torch.nn.Module, encoder: Encoder, rows: slice) -> torch.Tensor:
    """A reranker-shaped step on the harness's tiny encoder: 8 rows of 1 + 3 pairs, each pair's logit the first
    component of its embedding (the loss sees (B, 4) logits, as the module hands them over)."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(1000, 2000, (8 * 4, 12), generator=g)
    mask = torch.ones_like(ids)
    block = slice(rows.start * 4, rows.stop * 4)
    logits = encoder(input_ids=ids[block], attention_mask=mask[block])[:, 0] * 10
    return loss(logits.view(-1, 4)).loss


@pytest.mark.parametrize("loss", [default_loss("listwise"), default_loss("pointwise_bce", pos_weight=3.0)],
                         ids=["listwise", "bce"])
def test_two_ranks_train_exactly_like_one_process(tmp_path: Path, loss):
    ranks, loss_one, grads_one = two_ranks_and_one(tmp_path, partial(_group_step, loss), batch=8)
    assert ranks["loss"].item() == pytest.approx(loss_one, rel=1e-9)
    for name, grad in grads_one.items():
        torch.testing.assert_close(ranks["grads"][name], grad, rtol=1e-9, atol=1e-12)


# --- the model ----------------------------------------------------------------------------------------------------
def _tiny_reranker(**options) -> CrossEncoder:
    torch.manual_seed(0)
    return CrossEncoder.load(packaged_minilm_path(), max_length=64, random_init_config=TINY, **options).eval()


def test_length_chunks_give_the_same_scores_as_one_padded_pass():
    rng = random.Random(1)
    queries, docs = [_texts(rng, 8) for _ in range(16)], [_texts(rng, 40) for _ in range(16)]
    one = _tiny_reranker(length_chunks=1)
    chunked = _tiny_reranker(length_chunks=4)
    features = one.tokenize_pairs(queries, docs)
    with torch.no_grad():
        torch.testing.assert_close(chunked(**features), one(**features), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(one.score(queries, docs), one.score(queries[::-1], docs[::-1]).flip(0),
                               rtol=1e-5, atol=1e-6)


# --- validation ---------------------------------------------------------------------------------------------------
def test_reranking_orders_each_querys_candidates_by_score_and_pads():
    candidates = [[5, 3, 9], [2], [7, 1]]
    scores = torch.tensor([0.1, 0.9, 0.1, 3.0, -1.0, 2.0])
    ranked = reranked(candidates, scores, top_k=4)
    # equal scores keep the retriever's order (5 before 9)
    assert ranked.tolist() == [[3, 5, 9, -1], [2, -1, -1, -1], [1, 7, -1, -1]]
    ids = torch.tensor([4, 0, 2, 1, 3, 5, 0])  # a repeat, as a distributed sampler pads
    gathered = gather_pair_scores(ids, scores[ids], 6)
    torch.testing.assert_close(gathered, scores)
    with pytest.raises(RuntimeError, match="scored 5 of 6 pairs"):
        gather_pair_scores(ids[:-2], scores[ids[:-2]], 6)


def test_retriever_candidates_are_the_embedders_own_top_k(tmp_path: Path):
    encoder = Encoder.load(packaged_minilm_path(), max_length=32)
    queries = ["how to sort a list", "open a file for reading", "merge two dicts"]
    corpus = ["sorted(x) returns a new sorted list", "open(path) returns a file object", "rain in Paris",
              "d1 | d2 merges two dicts", "list.sort() sorts in place", "the weather today"]
    retrieval = RetrievalSet(queries, corpus, [{0, 4}, {1}, {3}])
    found = retriever_candidates(encoder, retrieval, depth=3)
    expected = rank_corpus(encoder.encode(queries), encoder.encode(corpus), 3).tolist()
    assert found == expected and found[0][0] in (0, 4)
    with pytest.raises(ConfigError, match="has no rows"):
        rows_candidates(retrieval, "scifact")


def test_rows_candidates_are_the_held_out_rows_documents():
    from gte_pro.data.records import Example

    rows = [Example("q1", ["p1"], ["n1", "n2"]), Example("q2", ["p2"], ["n1"]), Example("q1", ["p3"], [])]
    retrieval = RetrievalSet.from_examples(rows, ["d1"])
    assert retrieval.candidates == [[0, 1, 2, 4], [3, 1]]
    assert rows_candidates(retrieval, "") == retrieval.candidates
    no_negatives = RetrievalSet.from_examples([Example("q1", ["p1"], [])])
    with pytest.raises(ConfigError, match="carry no negatives"):
        rows_candidates(no_negatives, "")


# --- a whole run --------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def retriever_folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A small random embedder, saved: a fast eval.retriever for the runs below (the real default is MiniLM)."""
    torch.manual_seed(0)
    encoder = Encoder.load(packaged_minilm_path(), random_init_config=TINY, max_length=64)
    return str(export_sentence_transformers(encoder, tmp_path_factory.mktemp("retriever") / "model"))


def _rerank_run(retriever: str) -> list[str]:
    return ["task=rerank", "debug=fast", "model=reranker_tiny", f"eval.retriever={retriever}", "eval.rerank_depth=20",
            "data.num_negatives=3"]


def test_a_reranker_trains_validates_and_exports_what_it_scores(make_cfg, tmp_path: Path, retriever_folder: str,
                                                                capsys):
    from sentence_transformers import CrossEncoder as STCrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from gte_pro.training.rerank_module import RerankModule

    out = tmp_path / "run"
    value = train(make_cfg([*_rerank_run(retriever_folder), "logger=csv"], output_dir=out))
    metrics = json.loads((out / "metrics.json").read_text())
    assert value == pytest.approx(metrics["val"]["val/ndcg@10"]) and metrics["global_step"] == 4
    # the handoff to the recipe's next step names this run's export
    printed = capsys.readouterr().out
    assert f"mode=score data=jsonl data.train_file=<train.jsonl> score.teacher={out / 'model'}" in printed
    assert f"mine.rescore_with={out / 'model'}" in printed
    for prefix in ("val/", "val/retriever/"):
        assert {f"{prefix}{m}" for m in ("ndcg@10", "mrr@10", "recall@1", "recall@10", "recall@100",
                                         "map@100")} <= set(metrics["val"])
    # candidates outside the top 20 are never retrieved: the reranker's recall@100 is the retriever's at 20
    assert metrics["val"]["val/recall@100"] == metrics["val"]["val/retriever/recall@100"]
    assert metrics["val_before"]["val/retriever/ndcg@10"] == metrics["val"]["val/retriever/ndcg@10"]
    assert {"train/loss", "train/acc", "train/samples_per_s"} <= set(metrics["train"])
    exports = metrics["exports"]["max_abs_score_diff"]
    assert set(exports) == {"cross_encoder", "hf"} and max(exports.values()) <= 1e-4
    # each export, loaded by its own library, scores as the trained module does
    module = RerankModule.load_from_checkpoint(metrics["best_checkpoint"])
    queries = ["how do I sort a list", "open a file", "what is a dict"]
    docs = ["sorted() returns a new list", "open(path) gives a file object", "rain in Paris"]
    ours = module.encoder.score(queries, docs)
    theirs = STCrossEncoder(str(out / "model"), device="cpu").predict(list(zip(queries, docs, strict=True)),
                                                                      convert_to_tensor=True)
    torch.testing.assert_close(theirs.float().cpu(), ours, rtol=0, atol=1e-4)
    tokenizer = AutoTokenizer.from_pretrained(out / "hf")
    hf = AutoModelForSequenceClassification.from_pretrained(out / "hf").eval()
    with torch.no_grad():
        logits = hf(**tokenizer(queries, docs, padding=True, return_tensors="pt")).logits[:, 0]
    torch.testing.assert_close(logits, ours, rtol=0, atol=1e-4)
    assert "val/ndcg@10" in (out / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]


def test_mode_eval_reranks_a_beir_set_with_any_cross_encoder(make_cfg, tmp_path: Path, retriever_folder: str):
    """A reranker evaluated alone (a hub checkpoint, or an export) on a BEIR set: the retriever's top 20 of each
    query reranked, the figures beside the retriever's own, and the numbers a direct computation gives."""
    from gte_pro.data.beir import load_beir
    from gte_pro.evaluation.metrics import retrieval_metrics
    from tests.beir_data import write_beir_folder

    beir = write_beir_folder(tmp_path / "topics")
    folder = tmp_path / "reranker"
    _tiny_reranker().save(folder)
    out = tmp_path / "eval"
    train(make_cfg(["task=rerank", "mode=eval", "model=cross_encoder", f"model.name_or_path={folder}",
                    f"eval.beir=[{beir}]", f"eval.retriever={retriever_folder}", "eval.rerank_depth=20"],
                   output_dir=out))
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "rerank" and "reranking" in (out / "metrics.md").read_text()
    # the same candidates and scores, computed here without Lightning
    retrieval = load_beir(beir, "test")
    candidates = retriever_candidates(Encoder.load(retriever_folder), retrieval, depth=20)
    pairs = [(retrieval.queries[q], retrieval.corpus[d]) for q, docs in enumerate(candidates) for d in docs]
    reranker = CrossEncoder.load(str(folder), max_length=512)
    scores = reranker.score([q for q, _ in pairs], [d for _, d in pairs])
    expected = retrieval_metrics(reranked(candidates, scores), retrieval.relevant)
    for metric, value in expected.items():
        assert metrics["val"][f"val/topics/{metric}"] == pytest.approx(value, abs=1e-6), metric
    assert "val/topics/retriever/ndcg@10" in metrics["val"]


@pytest.mark.slow
def test_a_reranker_trains_on_two_ranks_and_validates_as_one_process(tmp_path: Path, cache_dir: Path,
                                                                     retriever_folder: str):
    """`task=rerank strategy=ddp devices=2` through train.py on gloo: candidates embedded in shares, pair scores
    gathered; the untrained model's figures (the same weights) equal one process's, the held-out split's and a BEIR
    set's, and the exports are verified."""
    import os
    import subprocess
    import sys

    from tests.beir_data import write_beir_folder
    from tests.conftest import REPO

    beir = write_beir_folder(tmp_path / "topics")
    base = [sys.executable, "train.py", *_rerank_run(retriever_folder), f"eval.beir=[{beir}]",
            f"paths.cache_dir={cache_dir}", "callbacks.progress_bar=null", "logger=none"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    runs = {}
    for devices in (1, 2):
        run_dir = tmp_path / f"devices{devices}"
        ddp = ["strategy=ddp", "devices=2"] if devices == 2 else []
        proc = subprocess.run([*base, *ddp, f"hydra.run.dir={run_dir}"], cwd=REPO, env=env, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        runs[devices] = json.loads((run_dir / "metrics.json").read_text())
    assert runs[2]["world_size"] == 2 and runs[2]["global_step"] == 4
    before_one, before_two = runs[1]["val_before"], runs[2]["val_before"]
    assert {"val/ndcg@10", "val/topics/ndcg@10", "val/topics/retriever/ndcg@10"} <= set(before_two)
    for key, value in before_one.items():
        assert before_two[key] == pytest.approx(value, abs=1e-6), key
    assert max(runs[2]["exports"]["max_abs_score_diff"].values()) <= 1e-4


@pytest.mark.slow
def test_a_stopped_rerank_run_resumes_to_bit_identical_weights(make_cfg, tmp_path: Path, retriever_folder: str):
    stop_at_step_7_and_resume(make_cfg, tmp_path, [*RUN, *_rerank_run(retriever_folder)])


# --- the config's refusals ----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("overrides", "message"), [
    (["task=rerank", "model=tiny"], "task=rerank trains a cross-encoder: choose model=reranker_minilm"),
    (["task=rerank", "loss=infonce"], "task=rerank needs a reranking loss: loss=listwise or loss=pointwise_bce"),
    (["loss=listwise"], "task=embed trains an embedder; gte_pro.training.losses.ListwiseLoss"),
    (["model=reranker_tiny"], "add task=rerank"),
    (["task=rerank", "mode=mine"], "mode=mine: task=rerank runs mode=train or mode=eval"),
    (["task=rerank", "data.remine.every_n_epochs=1"], "data.remine: re-mining refreshes an embedder's negatives"),
])
def test_a_task_and_its_parts_must_agree(make_cfg, overrides, message):
    from gte_pro.config.checks import check_config

    with pytest.raises(ConfigError) as refused:
        check_config(make_cfg(overrides))
    assert message in str(refused.value)


def test_an_unknown_task_lists_the_valid_ones(make_cfg):
    from hydra.errors import MissingConfigException

    with pytest.raises(MissingConfigException, match=r"task/rank(.|\n)*embed\n\trerank"):
        make_cfg(["task=rank"])


def test_the_retriever_batch_size_is_the_composed_one(make_cfg):
    """eval.retriever_batch_size is ${data.eval_batch_size} in the schema; the module reads the composed value (it
    fell back to 64 of its own where the key was missing)."""
    from gte_pro.modes.build import module_config
    from gte_pro.training.rerank_module import RerankModule

    for overrides, expected in (([], 128), (["data.eval_batch_size=96"], 96), (["eval.retriever_batch_size=8"], 8)):
        config = module_config(make_cfg(["task=rerank", *overrides]))
        assert RerankModule.options_from_config(config)["retriever_batch_size"] == expected
