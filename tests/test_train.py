"""End to end in one process: compose -> train(cfg) -> metrics.json + an exported model that other tools load."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gte_pro.train import train

TEXTS = ["How do I sort a dictionary by value?", "Return a new list containing all items in ascending order.",
         "tiny", "A much longer passage " * 20]


@pytest.fixture(scope="module")
def fast_run(tmp_path_factory, cache_dir):
    """One `debug=fast` fit shared by the tests of this module (the expensive part is importing Lightning)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from omegaconf import open_dict

    from tests.conftest import CONF

    out = tmp_path_factory.mktemp("fast_run")
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=["debug=fast", "logger=many", "callbacks=default"])
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        cfg.paths.output_dir = str(out)
        cfg.paths.cache_dir = str(cache_dir)
    value = train(cfg)
    return cfg, out, value


def test_fit_writes_metrics_checkpoints_logs_and_returns_the_metric(fast_run):
    cfg, out, value = fast_run
    metrics = json.loads((out / "metrics.json").read_text())
    assert value == pytest.approx(metrics["val"]["val/ndcg@10"])
    assert set(metrics["val_before"]) == set(metrics["val"]) >= {"val/ndcg@10", "val/mrr@10", "val/recall@1",
                                                                  "val/recall@10", "val/recall@100", "val/map@100"}
    assert metrics["global_step"] == 4
    assert {"train/loss", "train/acc", "train/sim_pos", "train/sim_neg", "train/samples_per_s"} <= set(metrics["train"])
    assert metrics["data"][0]["kept"] >= 1000
    assert Path(metrics["best_checkpoint"]).is_file() and (out / "checkpoints" / "last.ckpt").is_file()
    header = (out / "csv" / "version_0" / "metrics.csv").read_text().splitlines()[0]
    assert "train/loss" in header and "lr-AdamW" in header and "val/ndcg@10" in header
    assert list((out / "tensorboard").rglob("events.out.tfevents.*"))
    assert list((out / "wandb").glob("offline-run-*"))
    assert (out / "curves.png").read_bytes()[:4] == b"\x89PNG"  # loss, lr and validation from the CSV log
    # where the wall time went, phase by phase; the phases add up to the total
    timing = metrics["timing"]
    assert list(timing)[-2:] == ["other", "total"] and {"setup", "validation before", "training",
                                                        "validation after", "exports"} <= set(timing)
    assert sum(v for k, v in timing.items() if k != "total") == pytest.approx(timing["total"], abs=0.05)
    # the process's peak RSS as each phase ended: it only grows
    peaks = [metrics["peak_rss_mb"][phase] for phase in ("setup", "validation before", "training", "exports")]
    assert peaks == sorted(peaks) and peaks[0] > 100


def test_exported_model_loads_in_sentence_transformers_with_identical_embeddings(fast_run):
    from sentence_transformers import SentenceTransformer

    from gte_pro.models.encoder import Encoder

    cfg, out, _ = fast_run
    exported = SentenceTransformer(str(out / "model"), device="cpu")
    theirs = exported.encode(TEXTS, convert_to_tensor=True)
    # the module's weights = the best checkpoint's encoder
    state = torch.load(json.loads((out / "metrics.json").read_text())["best_checkpoint"], weights_only=False)
    encoder = Encoder.load(cfg.model.name_or_path, random_init_config=dict(cfg.model.random_init_config),
                           max_length=cfg.data.max_length)
    encoder.load_state_dict({k.removeprefix("encoder."): v for k, v in state["state_dict"].items()
                             if k.startswith("encoder.")})
    ours = encoder.encode(TEXTS)
    torch.testing.assert_close(theirs.cpu(), ours, atol=1e-5, rtol=1e-4)
    assert exported.max_seq_length == cfg.data.max_length


def test_the_run_records_what_its_config_left_to_the_machine(fast_run):
    """config -> resolve -> pre-flight: run_config.json keeps the training keys as composed and, under ``resolved``,
    what this start decided (processes and device, the length chunks the pre-flight assumed); the log said it once."""
    from gte_pro.launch.resume import RESOLVED, training_config

    cfg, out, _ = fast_run
    record = json.loads((out / "run_config.json").read_text())
    resolved = record.pop(RESOLVED)
    assert record == training_config(cfg)
    assert resolved["devices"] == resolved["world_size"] == resolved["nodes"] == 1
    assert resolved["cuda"] is False and resolved["fsdp"] is False and resolved["teacher_temperature"] is None
    assert resolved["length_chunks"] == 4  # model.length_chunks=auto on the CPU, the right-padding MiniLM tokenizer


def test_resume_from_checkpoint_continues_the_step_count(fast_run, make_cfg, tmp_path):
    _, out, _ = fast_run
    last = out / "checkpoints" / "last.ckpt"
    cfg = make_cfg(["debug=fast", "logger=none", "trainer.max_epochs=2", f"ckpt_path={last}"],
                   output_dir=tmp_path / "resumed")
    train(cfg)
    metrics = json.loads((tmp_path / "resumed" / "metrics.json").read_text())
    assert metrics["global_step"] == 8  # 4 steps restored + 4 more, not 4 from scratch
    assert metrics["val_before"] is None


@pytest.mark.slow
def test_lr_find_saves_its_plot_and_trains_with_the_suggestion(make_cfg, tmp_path):
    cfg = make_cfg(["debug=fast", "logger=none", "callbacks=none", "lr_find=true", "lr_find_steps=40",
                    "data.max_train_rows=200", "trainer.limit_train_batches=null"], output_dir=tmp_path / "lrf")
    train(cfg)
    metrics = json.loads((tmp_path / "lrf" / "metrics.json").read_text())
    assert (tmp_path / "lrf" / "lr_find.png").stat().st_size > 1000
    assert metrics["lr"] == pytest.approx(metrics["lr_find_suggestion"]) and metrics["lr"] != cfg.model.lr


def test_gte_loss_with_hard_negatives_trains(make_cfg, tmp_path, pairs_file, monkeypatch):
    from gte_pro.training.losses import GTELoss

    calls: list[tuple[tuple[int, ...], tuple[int, ...] | None]] = []
    forward = GTELoss.forward

    def spy(self, query, positive, negatives=None):
        calls.append((tuple(positive.shape), None if negatives is None else tuple(negatives.shape)))
        return forward(self, query, positive, negatives)

    monkeypatch.setattr(GTELoss, "forward", spy)
    cfg = make_cfg(["debug=fast", "logger=none", "loss=gte", "data=jsonl", f"data.train_file={pairs_file}",
                    "data.num_negatives=2", "data.val_fraction=0.2", "precision=bf16-mixed"],
                   output_dir=tmp_path / "gte")
    value = train(cfg)
    metrics = json.loads((tmp_path / "gte" / "metrics.json").read_text())
    # every training step went through the GTE loss with each query's 2 hard negatives
    dim = cfg.model.random_init_config.hidden_size
    assert metrics["global_step"] == 4 and calls == [((8, dim), (8, 2, dim))] * 4
    # the returned number is the best checkpoint's val/ndcg@10, and training moved it away from the start
    assert value == pytest.approx(metrics["val"]["val/ndcg@10"])
    assert metrics["val"] != pytest.approx(metrics["val_before"], abs=1e-6)
    assert (tmp_path / "gte" / "model" / "modules.json").is_file()


def test_run_stopping_mid_epoch_with_length_grouped_batches(make_cfg, tmp_path):
    """trainer.max_steps inside the first epoch: the default callbacks (early stopping on val/ndcg@10) must not
    fail for want of a validation at the epoch's end."""
    cfg = make_cfg(["debug=fast", "logger=none", "trainer.max_steps=2", "data.group_by_length=true",
                    "data.length_window=2"], output_dir=tmp_path / "mid")
    value = train(cfg)
    metrics = json.loads((tmp_path / "mid" / "metrics.json").read_text())
    assert metrics["global_step"] == 2 and value == pytest.approx(metrics["val"]["val/ndcg@10"])


def test_a_failing_job_closes_its_wandb_run_as_failed(make_cfg, tmp_path: Path):
    """A sweep runs its jobs in one process: a job that raises must not leave its wandb run open for the next."""
    import wandb

    cfg = make_cfg(["debug=fast", "logger=wandb", "model.lr=-1"], output_dir=tmp_path / "failed")
    with pytest.raises(ValueError, match="Invalid learning rate"):
        train(cfg)
    assert wandb.run is None
    run_dir = next((tmp_path / "failed" / "wandb").glob("offline-run-*"))
    assert list(run_dir.glob("*.wandb"))  # the run was really started (and then closed)


def test_load_from_checkpoint_rebuilds_the_module_with_its_weights(fast_run):
    from gte_pro.models.encoder import Encoder
    from gte_pro.training.module import ContrastiveModule

    cfg, out, _ = fast_run
    best = json.loads((out / "metrics.json").read_text())["best_checkpoint"]
    module = ContrastiveModule.load_from_checkpoint(best)
    assert cfg.loss._target_.endswith("." + type(module.loss).__name__)
    assert module.lr == cfg.model.lr and module.seed == cfg.seed
    exported = Encoder.load(str(out / "model"), max_length=cfg.data.max_length)  # the export holds the best weights
    torch.testing.assert_close(module.encoder.encode(TEXTS), exported.encode(TEXTS), atol=1e-5, rtol=1e-4)


def test_the_final_metrics_are_those_of_validating_the_best_checkpoint(fast_run):
    """The run reuses the metrics of the best checkpoint's validation during fit instead of validating it again."""
    from gte_pro.evaluation.report import merge_results
    from gte_pro.modes.build import build_datamodule, build_trainer
    from gte_pro.training.module import ContrastiveModule

    cfg, out, _ = fast_run
    metrics = json.loads((out / "metrics.json").read_text())
    module = ContrastiveModule.load_from_checkpoint(metrics["best_checkpoint"])
    encoder = module.encoder
    datamodule = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    fresh = merge_results(build_trainer(cfg, callbacks=[], loggers=[]).validate(module, datamodule=datamodule,
                                                                                 verbose=False))
    assert fresh == pytest.approx(metrics["val"], abs=1e-6) and "val/ndcg@10" in fresh


def test_an_unknown_optimized_metric_fails_before_training(make_cfg, tmp_path):
    cfg = make_cfg(["debug=fast", "logger=none", "optimized_metric=val/ndcg@11"], output_dir=tmp_path / "metric")
    with pytest.raises(ValueError, match=r"optimized_metric='val/ndcg@11' is not a metric of this run; "
                                         r"valid choices: .*val/ndcg@10"):
        train(cfg)
    assert not (tmp_path / "metric" / "checkpoints").exists()  # it stopped before the first step


def test_eval_before_false_skips_the_untrained_models_validation(make_cfg, tmp_path):
    cfg = make_cfg(["debug=fast", "logger=none", "eval.before=false"], output_dir=tmp_path / "nobefore")
    value = train(cfg)
    metrics = json.loads((tmp_path / "nobefore" / "metrics.json").read_text())
    assert metrics["val_before"] is None and value == pytest.approx(metrics["val"]["val/ndcg@10"])
    assert not (tmp_path / "nobefore" / "val_before.json").exists()
    assert "ndcg@10 before" not in (tmp_path / "nobefore" / "metrics.md").read_text()
