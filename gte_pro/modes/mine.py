"""``mode=mine``: mine hard negatives for the training rows of any data source with any encoder.

    python train.py mode=mine data=jsonl data.train_file=train.jsonl model=encoder model.name_or_path=<run>/model
    python train.py data=jsonl data.train_file=<run dir>/mined.jsonl data.num_negatives=15   # then train on it

The queries are the training rows' queries; the corpus is every row's positives plus ``mine.corpus_files``. Each
row's own negatives are replaced by the mined ones (see conf/mine/default.yaml for the options). Validation rows
that the data module split off the training rows (``data.val_fraction``) are written back unchanged, so that
training on the output holds out the same queries with the same validation corpus; with a separate validation file
or split, pass it again (``data.val_file=...``). Like evaluation,
the run goes through the project's trainer, so ``strategy=ddp devices=N`` starts N processes: each embeds 1/N of
the texts, the corpus stays sharded, and the output is the same file one process writes (``gte_pro.mining.core``).

With ``mine.rescore_with=<teacher>`` the embedder's window is judged by a teacher (``gte_pro.mining.rescore``):
every rank loads it, scores its share of the pairs, and the file carries the teacher's ``pos_scores``/``neg_scores``.

Writes (rank 0) ``mine.output`` (default ``<run dir>/mined.jsonl``), ``mine_report.json``, ``mine_report.md`` and
``mine_scores.png`` in the run folder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from lightning.pytorch import LightningDataModule, LightningModule
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader

from gte_pro.errors import ConfigError
from gte_pro.mining.core import MinedNegatives
from gte_pro.mining.corpus import TextStore, ensure_text_store
from gte_pro.mining.embed import mine_texts
from gte_pro.mining.options import (
    MiningOptions,
    RescoreOptions,
    mining_options,
    rescore_options,
    teacher_margin_problems,
)
from gte_pro.mining.problem import MiningProblem, build_problem, corpus_files_setting, hash_held_out_rows
from gte_pro.mining.report import write_mine_outputs
from gte_pro.mining.rescore import Rescored, rescore_window, window_options
from gte_pro.models.encoder import Encoder
from gte_pro.models.teacher import Teacher, load_teacher
from gte_pro.modes.build import build_datamodule, build_encoder, build_trainer, start_run
from gte_pro.utils.cache import cache_root
from gte_pro.utils.timing import peak_rss_mb_per_rank

log = logging.getLogger(__name__)


class MiningData(LightningDataModule):
    """The configured data module's training rows plus the corpus files, as a MiningProblem on every rank.

    Lightning calls ``prepare_data`` on local rank 0 only (the data module's token cache and the corpus files'
    store are built once, as in training) and ``setup`` on every rank after it. The one placeholder validation
    batch per rank only makes Lightning run the module's validation hooks, where the mining happens."""

    def __init__(self, source: Any, store_folder: Callable[[], Path] | None, min_doc_chars: int) -> None:
        super().__init__()
        self.source = source
        self.store_folder = store_folder  # the corpus files' store (built if there is none); None without files
        self.min_doc_chars = min_doc_chars
        self.problem: MiningProblem | None = None

    def corpus_store(self) -> TextStore | None:
        return TextStore(self.store_folder()) if self.store_folder is not None else None

    def prepare_data(self) -> None:
        self.source.prepare_data()
        if self.store_folder is not None:
            self.store_folder()

    def setup(self, stage: str | None = None) -> None:
        if self.problem is None:
            self.source.setup(stage)
            self.problem = build_problem(self.source.train_rows, self.corpus_store(), self.min_doc_chars,
                                         hash_held_out_rows(self.source))
            log.info("mining: %d rows, %d distinct queries, a corpus of %d documents", len(self.problem.rows),
                     len(self.problem.queries), len(self.problem.corpus))

    def val_dataloader(self) -> DataLoader:
        return DataLoader([0], batch_size=1)


class MiningModule(LightningModule):
    """Runs ``mine_texts`` on every rank once the process group exists and the encoder is on its device; with a
    teacher, the embedder mines the window and the teacher judges it (``rescore_window``)."""

    def __init__(self, encoder: Encoder, options: MiningOptions, batch_size: int, max_length: int,
                 teacher: Teacher | None = None, rescore: RescoreOptions | None = None) -> None:
        super().__init__()
        self.encoder = encoder
        self.options = options
        self.batch_size = batch_size
        self.max_length = max_length
        self.teacher, self.rescore = teacher, rescore  # a plain attribute: moved to the device by the hook
        self.mined: MinedNegatives | None = None
        self.rescored: Rescored | None = None
        self.timings: dict[str, float] = {}

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        return None

    def on_validation_epoch_end(self) -> None:
        problem = self.trainer.datamodule.problem
        # the trainer's precision for the encoder; the scores themselves are float32 (mine_negatives)
        options = self.options if self.teacher is None else window_options(self.options)
        self.mined = mine_texts(self.encoder, problem.queries, problem.corpus, problem.positives, options,
                                self.batch_size, self.max_length, self.global_rank, self.trainer.world_size,
                                self.trainer.precision_plugin.forward_context, self.timings)
        if self.teacher is not None and self.rescore is not None:
            self.mined, self.rescored = rescore_window(
                self.teacher.to(self.device), problem.queries, problem.corpus, problem.positives, self.mined,
                self.options, self.rescore.batch_size, self.global_rank, self.trainer.world_size, self.device,
                problem.held_out)
            self.timings["rescore_s"] = self.rescored.seconds


def mine(cfg: DictConfig) -> None:
    """Mine as ``cfg.mine`` says; rank 0 writes the mined file, the report and the plot."""
    output_dir = start_run(cfg)
    options = mining_options(cfg.mine, cfg.seed)
    rescore = rescore_options(cfg.mine)
    teacher = None
    if rescore is not None:  # loaded before the corpus is embedded: a wrong path or margin fails at once
        teacher = load_teacher(rescore.name_or_path, rescore.max_length,
                               bool(OmegaConf.select(cfg, "model.trust_remote_code", default=False)), rescore.kind)
        if problems := teacher_margin_problems(options, teacher.kind):
            raise ConfigError("invalid mining options:\n  " + "\n  ".join(problems))
    corpus_files = corpus_files_setting(OmegaConf.to_container(cfg.mine, resolve=True).get("corpus_files"))
    output = Path(cfg.mine.output).expanduser() if cfg.mine.get("output") else output_dir / "mined.jsonl"
    encoder = build_encoder(cfg)
    source = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    cache_dir = cache_root(OmegaConf.select(cfg, "paths.cache_dir", default=None))
    store_folder = partial(ensure_text_store, corpus_files, encoder.tokenizer, int(cfg.mine.max_length),
                           encoder.doc_prefix, cache_dir) if corpus_files else None
    data = MiningData(source, store_folder, int(getattr(source, "min_doc_chars", 0) or 0))
    module = MiningModule(encoder, options, int(cfg.mine.batch_size), int(cfg.mine.max_length), teacher, rescore)
    trainer = build_trainer(cfg, callbacks=[], loggers=[])  # nothing is trained: no checkpoints, no loggers
    start = time.perf_counter()
    trainer.validate(module, datamodule=data, verbose=False)
    seconds = time.perf_counter() - start
    peaks = peak_rss_mb_per_rank()
    if trainer.is_global_zero:
        assert data.problem is not None and module.mined is not None
        texts = len(data.problem.queries) + len(data.problem.corpus)
        details = {"model": encoder.name_or_path, "world_size": trainer.world_size,
                   "precision": str(cfg.trainer.precision), "options": vars(options),
                   "corpus_files": corpus_files, "batch_size": module.batch_size, "max_length": module.max_length,
                   "val_fraction": getattr(source, "val_fraction", None),
                   "seconds": round(seconds, 3), "texts_per_s": round(texts / max(seconds, 1e-9), 1),
                   "peak_rss_mb_per_rank": [round(mb, 1) for mb in peaks],
                   **{name: round(value, 3) for name, value in module.timings.items()}}
        if rescore is not None:
            details["rescore_options"] = vars(rescore)
        write_mine_outputs(output, output_dir, data.problem, module.mined, details, module.rescored)
