"""The commands that take a finished run to the next step of the teacher recipe (docs/teachers.md), printed at the
end of the run as ``mode=mine`` prints its training command: pairs -> mine -> train a reranker -> score with it ->
distil it into the embedder."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from gte_pro.config.schema.data import JsonlData


def training_file(cfg: DictConfig) -> str:
    """The run's JSON-lines training file, or a placeholder for a source that is not one (demo, hf, beir, mix)."""
    if cfg.data._target_ == JsonlData._target_:
        return str(cfg.data.train_file)
    return "<train.jsonl>"


def after_reranker(cfg: DictConfig, model_dir: Path) -> str:
    """What to do with a trained reranker: score the training rows with it, or mine again with it judging."""
    rows = training_file(cfg)
    return (f"next, score the training rows with this reranker (teacher scores for distillation):\n"
            f"  python train.py mode=score data=jsonl data.train_file={rows} score.teacher={model_dir}\n"
            f"or mine again with it dropping the candidates it judges relevant (writes the scores too):\n"
            f"  python train.py mode=mine data=jsonl data.train_file={rows} mine.rescore_with={model_dir} "
            "mine.relative_margin=null\n"
            # a shell comment, not a trailing "(or ...)": the printed line runs as it is once <that run> is filled in
            "then: python train.py experiment=distill data.train_file=<that run>/scored.jsonl  # or its mined.jsonl")
