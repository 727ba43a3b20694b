"""``mode=score``: teacher scores for every row of a training file, in FlagEmbedding's layout.

    python train.py mode=score score.teacher=<cross-encoder folder or hub name> data=jsonl data.train_file=train.jsonl
    python train.py loss=distill_kl data=jsonl data.train_file=<run dir>/scored.jsonl   # then train on it

Each row's (query, positive) and (query, negative) pairs are scored by ``score.teacher`` (a cross-encoder's logit,
an embedder's cosine; ``gte_pro.models.teacher``) and the row is written back unchanged plus ``pos_scores`` and
``neg_scores``. Like mining, the run goes through Lightning Fabric with the trainer's devices, precision and
strategy (``gte_pro.modes.build.build_fabric``), so ``strategy=ddp devices=N`` starts N processes; each scores its
share of the input's fixed shards (``gte_pro.scoring``), which land in ``<run dir>/score_shards/`` as they finish.
The same command in the same run folder (``hydra.run.dir=<run dir>``) after a kill scores only the missing shards;
the output is the same bytes for any number of processes and after any number of restarts.

Writes (rank 0) ``score.output`` (default ``<run dir>/scored.jsonl``), ``score_report.json``, ``score_report.md``
and ``score_hist.png`` in the run folder.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.fabric import Fabric
from omegaconf import DictConfig, OmegaConf
from torch import nn

from gte_pro.config.schema.data import JsonlData
from gte_pro.errors import ConfigError, MissingModelError
from gte_pro.launch.stop import STOP
from gte_pro.models.teacher import Teacher, load_teacher
from gte_pro.modes.build import build_fabric, on_device, start_run
from gte_pro.scoring.core import (
    ShardPlan,
    file_scores,
    plan_shards,
    score_rank,
    scores_whole_file,
    teacher_settings,
)
from gte_pro.scoring.report import write_score_outputs
from gte_pro.scoring.shards import ShardFolder
from gte_pro.scoring.teacher_file import file_groups, file_shapes, flat_groups, teacher_record, write_record
from gte_pro.utils.timing import peak_rss_mb_per_rank

JSONL_DATA = JsonlData._target_


def score_shards(fabric: Fabric, teacher: Teacher, source: str, shards: ShardFolder, batch_size: int,
                 shard_rows: int, members_out: list[torch.Tensor] | None = None) -> tuple[ShardPlan, dict[str, float]]:
    """Plans the shards and scores this rank's share with the teacher on its device in the run's precision; the
    ranks wait for each other after planning (so that no rank counts another's new shard as an old one) and after
    scoring (so that rank 0 finds every shard). The plan, and this rank's pairs and seconds. ``members_out``: an
    ensemble's members' standardised scores of the file's pairs, when they were scored now (``file_scores``)."""
    for member in getattr(teacher, "members", [teacher]):
        if isinstance(getattr(member, "model", None), nn.Module):
            on_device(fabric, member.model)  # the run's precision (bf16-true, ...), as for a module
    teacher.to(fabric.device)
    shards.prepare()
    plan = plan_shards(source, shard_rows, shards)
    fabric.barrier()
    with torch.inference_mode():
        scores = (file_scores(teacher, source, shard_rows, batch_size, fabric.device, fabric.autocast, members_out)
                  if scores_whole_file(teacher) and plan.pending_pairs else None)
        timing = score_rank(teacher, source, shard_rows, batch_size, shards, plan, fabric.autocast, scores)
    fabric.barrier()
    return plan, timing


def student_scores(fabric: Fabric, options: DictConfig, source: str, batch_size: int, shard_rows: int
                   ) -> np.ndarray | None:
    """``score.student``'s cosine of every pair of the file, in file order (collective), or None when unset."""
    if not options.get("student"):
        return None
    name = str(Path(options.student).expanduser()) if str(options.student).startswith("~") else str(options.student)
    try:
        student = load_teacher(name, int(options.max_length), bool(options.trust_remote_code), "embedder")
    except MissingModelError as err:
        raise MissingModelError(f"score.student={options.student}: {str(err).split(': ', 1)[-1]}") from err
    on_device(fabric, student.model)
    student.to(fabric.device)
    with torch.inference_mode():
        per_shard = file_scores(student, source, shard_rows, batch_size, fabric.device, fabric.autocast)
    return np.concatenate(per_shard) if per_shard else np.zeros(0, dtype=np.float32)


def judge_teacher(output: Path, teacher: Teacher, members: list[torch.Tensor], student: np.ndarray | None,
                  student_name: str | None) -> dict[str, Any]:
    """The teacher record of the scored file (``gte_pro.scoring.teacher_file``), written beside it: the teacher's
    figures on the rows' own labels, each ensemble member's (scored in this run), the student's (``score.student``)."""
    shapes = file_shapes(output)
    named = zip(getattr(teacher, "members", []), members, strict=False)
    record = teacher_record(
        teacher.name_or_path, teacher.kind, file_groups(output),
        student=None if student is None else (str(student_name), flat_groups(student, shapes)),
        members=[(member.name_or_path, member.kind, flat_groups(scores.numpy(), shapes)) for member, scores in named])
    write_record(output, record)
    return record


def input_file(cfg: DictConfig) -> Path:
    """``score.input``, or ``data.train_file`` with data=jsonl."""
    if cfg.score.get("input"):
        return Path(cfg.score.input).expanduser()
    if OmegaConf.select(cfg, "data._target_", default=None) == JSONL_DATA and cfg.data.get("train_file"):
        return Path(cfg.data.train_file).expanduser()
    raise ConfigError("score.input: not set, and the data source has no training file to score (data.train_file "
                      "of data=jsonl)",
                      hint="set score.input=<train.jsonl>, or data=jsonl data.train_file=<train.jsonl>")


def score(cfg: DictConfig) -> None:
    """Score as ``cfg.score`` says; rank 0 writes the scored file, the report and the histograms."""
    options = cfg.score
    if not options.get("teacher"):
        raise ConfigError("score.teacher is required with mode=score",
                          hint="set score.teacher=<cross-encoder folder or hub name> (or an embedder, with "
                               "score.teacher_kind=embedder where its folder does not say)")
    source = input_file(cfg)
    output_dir, _ = start_run(cfg)
    output = Path(options.output).expanduser() if options.get("output") else output_dir / "scored.jsonl"
    if output.resolve() == source.resolve():
        raise ConfigError(f"score.output={output} is the input file", hint="write the scores to another file")
    batch_size, max_length, shard_rows = int(options.batch_size), int(options.max_length), int(options.shard_rows)
    names = [options.teacher] if isinstance(options.teacher, str) else list(options.teacher)
    # a hub name stays as written
    names = [str(Path(name).expanduser()) if str(name).startswith("~") else str(name) for name in names]
    name = names[0] if len(names) == 1 else names
    try:
        teacher = load_teacher(name, max_length, bool(options.trust_remote_code), options.teacher_kind)
    except MissingModelError as err:  # it names model.name_or_path, the key of the models it loads
        raise MissingModelError(f"score.teacher={options.teacher}: {str(err).split(': ', 1)[-1]}") from err
    settings = teacher_settings(teacher, max_length, batch_size, shard_rows, str(cfg.trainer.precision))
    shards = ShardFolder(output_dir / "score_shards", settings)
    fabric = build_fabric(cfg)  # nothing is trained: no checkpoints, no loggers
    start = time.perf_counter()
    fabric.launch()
    STOP.forward_to(fabric.strategy.launcher)  # a kill of this process stops the ranks it started too
    members: list[torch.Tensor] = []
    plan, _ = score_shards(fabric, teacher, str(source), shards, batch_size, shard_rows, members)
    student = student_scores(fabric, options, str(source), batch_size, shard_rows)
    seconds = time.perf_counter() - start
    peaks = peak_rss_mb_per_rank()
    if fabric.is_global_zero:
        markers = shards.markers(plan.shards)
        shards.assemble(output, markers)
        details = {"teacher": teacher.name_or_path, "kind": teacher.kind, "input": str(source),
                   "world_size": fabric.world_size, "precision": str(cfg.trainer.precision),
                   "max_length": max_length, "batch_size": batch_size, "shard_rows": shard_rows,
                   "shards_scored": plan.shards - sum(plan.done), "shards_reused": sum(plan.done),
                   "pairs_scored": plan.pending_pairs, "seconds": round(seconds, 3),
                   "pairs_per_s": round(plan.pending_pairs / max(seconds, 1e-9), 1),
                   "peak_rss_mb_per_rank": [round(mb, 1) for mb in peaks]}
        details["judgement"] = judge_teacher(output, teacher, members, student, options.get("student"))
        write_score_outputs(output, output_dir, markers, details)
