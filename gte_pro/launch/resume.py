"""Which checkpoint a run continues from."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)

RESUME_CHOICES = ("auto", "never")


def resume_checkpoint(ckpt_path: str | None, resume: str, output_dir: Path) -> str | None:
    """An explicit ``ckpt_path`` wins; with ``resume=auto`` a run folder that has ``checkpoints/last.ckpt`` (a
    requeued SLURM job, or a re-run into the same ``hydra.run.dir``) continues from it."""
    if ckpt_path:
        if not Path(ckpt_path).is_file():
            raise FileNotFoundError(f"ckpt_path={ckpt_path}: no such checkpoint file")
        return str(ckpt_path)
    if resume not in RESUME_CHOICES:
        raise ValueError(f"resume={resume!r} is not valid; valid choices: {', '.join(RESUME_CHOICES)}")
    last = output_dir / "checkpoints" / "last.ckpt"
    if resume == "auto" and last.is_file():
        log.info("resuming from %s", last)
        return str(last)
    return None
