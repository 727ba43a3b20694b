"""``mode=mine``: mine hard negatives for the training rows of any data source with any encoder.

    python train.py mode=mine data=jsonl data.train_file=train.jsonl model=encoder model.name_or_path=<run>/model
    python train.py data=jsonl data.train_file=<run dir>/mined.jsonl data.num_negatives=15   # then train on it

The queries are the training rows' queries; the corpus is every row's positives plus ``mine.corpus_files``. Each
row's own negatives are replaced by the mined ones (see conf/mine/default.yaml for the options). Validation rows
that the data module split off the training rows (``data.val_fraction``) are written back unchanged, so that
training on the output holds out the same queries with the same validation corpus; with a separate validation file
or split, pass it again (``data.val_file=...``). The run goes through Lightning Fabric with the trainer's devices,
precision and strategy (``gte_pro.modes.build.build_fabric``), so ``strategy=ddp devices=N`` starts N processes:
each embeds 1/N of the texts, the corpus stays sharded, and the output is the same file one process writes
(``gte_pro.mining.core``).

With ``mine.rescore_with=<teacher>`` the embedder's window is judged by a teacher (``gte_pro.mining.rescore``):
every rank loads it, scores its share of the pairs, and the file carries the teacher's ``pos_scores``/``neg_scores``.

Writes (rank 0) ``mine.output`` (default ``<run dir>/mined.jsonl``), ``mine_report.json``, ``mine_report.md`` and
``mine_scores.png`` in the run folder.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf

from gte_pro.errors import ConfigError
from gte_pro.launch.stop import STOP
from gte_pro.mining.core import MinedNegatives
from gte_pro.mining.corpus import TextStore, ensure_text_store
from gte_pro.mining.embed import mine_texts
from gte_pro.mining.kept_window import drop_window, keep_window, load_window, window_fingerprint
from gte_pro.mining.options import (
    MiningOptions,
    RescoreOptions,
    mining_options,
    rescore_options,
    teacher_margin_problems,
)
from gte_pro.mining.problem import MiningProblem, build_problem, corpus_files_setting, hash_held_out_rows
from gte_pro.mining.report import carried_overrides, nothing_kept, write_mine_outputs
from gte_pro.mining.rescore import Rescored, rescore_window, window_options
from gte_pro.models.encoder import Encoder
from gte_pro.models.loading import describe_model
from gte_pro.models.teacher import Teacher, load_teacher
from gte_pro.modes.build import build_datamodule, build_encoder, build_fabric, on_device, start_run
from gte_pro.utils.cache import cache_root
from gte_pro.utils.timing import peak_rss_mb_per_rank

log = logging.getLogger(__name__)


class MiningData:
    """The configured data module's training rows plus the corpus files, as a MiningProblem on every rank.

    ``prepare_data`` runs on local rank 0 only (the data module's token cache and the corpus files' store are built
    once, as in training), ``setup`` on every rank after it."""

    def __init__(self, source: Any, store_folder: Callable[[], Path] | None, min_doc_chars: int) -> None:
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

    def setup(self, stage: str | None = None) -> MiningProblem:
        if self.problem is None:
            self.source.setup(stage)
            self.problem = build_problem(self.source.train_rows, self.corpus_store(), self.min_doc_chars,
                                         hash_held_out_rows(self.source))
            log.info("mining: %d rows, %d distinct queries, a corpus of %d documents", len(self.problem.rows),
                     len(self.problem.queries), len(self.problem.corpus))
        return self.problem


@dataclass
class Mined:
    """What the ranks mined (the same on every rank), with the teacher's judgement and the phases' seconds."""

    negatives: MinedNegatives
    rescored: Rescored | None
    timings: dict[str, float]


def mine_problem(fabric: Fabric, encoder: Encoder, problem: MiningProblem, options: MiningOptions, batch_size: int,
                 max_length: int, teacher: Teacher | None = None, rescore: RescoreOptions | None = None,
                 run_dir: Path | None = None) -> Mined:
    """``mine_texts`` on every rank with the encoder on its device in the run's precision; with a teacher, the
    embedder mines the window and the teacher judges it (``rescore_window``). With a teacher and ``run_dir``, the
    window is kept in the run folder once mined, and an earlier start's window of the same inputs is reused
    (``gte_pro.mining.kept_window``): a run stopped while the teacher rescored continues with the rescoring."""
    encoder = on_device(fabric, encoder)
    timings: dict[str, float] = {}
    # the run's precision for the encoder; the scores themselves are float32 (mine_negatives)
    window = options if teacher is None else window_options(options)
    keep = run_dir is not None and teacher is not None
    settings = {**vars(window), "batch_size": batch_size, "max_length": max_length, "ranks": fabric.world_size,
                "precision": str(getattr(fabric.strategy.precision, "precision", ""))}
    fingerprint = window_fingerprint(encoder, problem, settings) if keep else ""
    with torch.inference_mode():
        mined = load_window(run_dir, fingerprint) if keep else None
        if mined is None:
            mined = mine_texts(encoder, problem.queries, problem.corpus, problem.positives, window, batch_size,
                               max_length, fabric.autocast, timings)
            if keep and fabric.is_global_zero:
                keep_window(run_dir, fingerprint, mined)
        rescored = None
        if teacher is not None and rescore is not None:
            mined, rescored = rescore_window(teacher.to(fabric.device), problem.queries, problem.corpus,
                                             problem.positives, mined, options, rescore.batch_size, fabric.device,
                                             problem.held_out)
            timings["rescore_s"] = rescored.seconds
    return Mined(mined, rescored, timings)


def mine(cfg: DictConfig) -> None:
    """Mine as ``cfg.mine`` says; rank 0 writes the mined file, the report and the plot."""
    output_dir, _ = start_run(cfg)
    options = mining_options(cfg.mine, cfg.seed)
    rescore = rescore_options(cfg.mine)
    teacher = None
    if rescore is not None:  # loaded before the corpus is embedded: a wrong path or margin fails at once
        teacher = load_teacher(rescore.name_or_path, rescore.max_length,
                               bool(cfg.model.get("trust_remote_code")), rescore.kind)
        if problems := teacher_margin_problems(options, teacher.kind):
            raise ConfigError("invalid mining options:\n  " + "\n  ".join(problems))
    corpus_files = corpus_files_setting(OmegaConf.to_container(cfg.mine, resolve=True).get("corpus_files"))
    output = Path(cfg.mine.output).expanduser() if cfg.mine.get("output") else output_dir / "mined.jsonl"
    encoder = build_encoder(cfg)
    source = build_datamodule(cfg, encoder.tokenizer, encoder.query_prefix, encoder.doc_prefix)
    cache_dir = cache_root(OmegaConf.select(cfg, "paths.cache_dir", default=None))
    store_folder = partial(ensure_text_store, corpus_files, encoder.tokenizer, int(cfg.mine.max_length),
                           encoder.doc_prefix, cache_dir) if corpus_files else None
    data = MiningData(source, store_folder, int(cfg.data.min_doc_chars))
    batch_size, max_length = int(cfg.mine.batch_size), int(cfg.mine.max_length)
    fabric = build_fabric(cfg)  # nothing is trained: no checkpoints, no loggers
    start = time.perf_counter()
    fabric.launch()
    STOP.forward_to(fabric.strategy.launcher)  # a kill of this process stops the ranks it started too
    with fabric.rank_zero_first(local=True):
        if fabric.local_rank == 0:
            data.prepare_data()
    problem = data.setup("validate")
    mined = mine_problem(fabric, encoder, problem, options, batch_size, max_length, teacher, rescore, output_dir)
    if empty := nothing_kept(problem, mined.negatives, vars(options), teacher is not None):  # every rank: the same
        raise ConfigError(empty[0], hint=empty[1])
    seconds = time.perf_counter() - start
    peaks = peak_rss_mb_per_rank()
    if fabric.is_global_zero:
        texts = len(problem.queries) + len(problem.corpus)
        model = describe_model(encoder.name_or_path, OmegaConf.select(cfg, "model.random_init_config", default=None))
        details = {"model": model, "world_size": fabric.world_size,
                   "precision": str(cfg.trainer.precision), "options": vars(options),
                   "corpus_files": corpus_files, "batch_size": batch_size, "max_length": max_length,
                   "val_fraction": float(cfg.data.val_fraction),
                   "seconds": round(seconds, 3), "texts_per_s": round(texts / max(seconds, 1e-9), 1),
                   "peak_rss_mb_per_rank": [round(mb, 1) for mb in peaks],
                   **{name: round(value, 3) for name, value in mined.timings.items()}}
        if rescore is not None:
            details["rescore_options"] = vars(rescore)
        details["carried_overrides"] = carried_overrides(run_overrides())
        write_mine_outputs(output, output_dir, problem, mined.negatives, details, mined.rescored)
        drop_window(output_dir)  # the run is done: nothing left to continue


def run_overrides() -> list[str]:
    """The command line's overrides of this run ([] for a config composed in Python: tests, a notebook)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []
