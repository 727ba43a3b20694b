"""Long steps without a progress bar log what is done, the rate and the time left."""

from __future__ import annotations

import logging

import pytest

from gte_pro.utils.progress import Progress


def test_known_total_gives_rate_and_eta_unknown_gives_the_rate(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="gte_pro.progress"):
        known = Progress("embedding corpus", total=1000, every_s=0.0)
        known.update(250)
        known.finish()
        unknown = Progress("tokenizing", unit="rows", every_s=0.0)
        unknown.update(4096)
        unknown.finish(5000)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("embedding corpus: 250 / 1000 texts, ") and " texts/s, ETA " in lines[0]
    assert lines[1].startswith("embedding corpus: 1000 texts in ")
    assert lines[2].startswith("tokenizing: 4096 rows, ") and lines[2].endswith(" rows/s") and "ETA" not in lines[2]
    assert lines[3].startswith("tokenizing: 5000 rows in ")


def test_other_ranks_and_early_updates_write_nothing(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="gte_pro.progress"):
        Progress("embedding", total=10, every_s=0.0, quiet=True).update(5)
        Progress("embedding", total=10, every_s=3600.0).update(5)  # not yet due
    assert not caplog.records


def test_the_training_bar_shows_one_line_of_five_figures(tmp_path):
    import torch
    from lightning.pytorch import LightningModule, Trainer

    from gte_pro.training.callbacks import ProgressBar

    class Tiny(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            loss = self.layer(batch[0]).pow(2).mean()
            # what the contrastive module and Throughput log with prog_bar=True: only five figures may show
            self.log_dict({"train/loss": loss, "train/acc": 0.5, "train/sim_pos": 0.9, "train/samples_per_s": 12.34},
                          prog_bar=True)
            return loss

        def validation_step(self, batch, batch_idx):
            self.log_dict({"val/ndcg@10": 0.61234, "val/beir/ndcg@10": 0.5}, prog_bar=True)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=3e-4)

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.ones(4, 2)), batch_size=2)
    bar = ProgressBar()
    trainer = Trainer(max_steps=2, callbacks=[bar], logger=False, enable_checkpointing=False,
                      default_root_dir=tmp_path, log_every_n_steps=1, enable_model_summary=False)
    module = Tiny()
    trainer.fit(module, data, data)
    assert bar.get_metrics(trainer, module) == {"step": 2, "loss": f"{trainer.progress_bar_metrics['train/loss']:.4f}",
                                                "lr": "3.00e-04", "samples/s": "12.3", "val/ndcg@10": "0.6123"}
