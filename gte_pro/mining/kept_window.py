"""``mode=mine`` with a teacher keeps its finished stage: the embedder's mined window.

Mining with ``mine.rescore_with`` has two long stages: the embedder embeds the queries and the corpus and mines a
window of candidates, then the teacher judges that window. The first stage's result (a few tensors of
queries x window) is written to ``<run>/mined_window.pt`` when it ends, so that a run stopped during the
rescoring (SIGTERM, SIGINT, a preemption, a kill) and started again with the same command rescored only: its output
is the same, byte for byte. The file names what it was mined from (a fingerprint of the queries, the positives, the
corpus, the encoder's weights and the mining options); a file of other inputs is ignored and replaced. The finished
run removes it.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import torch
import xxhash

from gte_pro.mining.core import MinedNegatives
from gte_pro.mining.problem import MiningProblem
from gte_pro.utils.files import write_atomic

log = logging.getLogger(__name__)

WINDOW_FILE = "mined_window.pt"


def window_fingerprint(encoder: torch.nn.Module, problem: MiningProblem, settings: dict[str, Any]) -> str:
    """A hash of everything the mined window depends on: the problem's texts and positives, the encoder's weights
    and the mining settings (options, batch size, max_length, ranks)."""
    digest = xxhash.xxh3_128()
    for text in problem.queries:
        digest.update(text.encode())
        digest.update(b"\0")
    digest.update(repr(problem.positives).encode())
    for text in problem.corpus.texts:
        digest.update(text.encode())
        digest.update(b"\0")
    digest.update(np.ascontiguousarray(problem.corpus.rows).tobytes())
    if problem.corpus.store is not None:  # its folder's name is the hash of its files, tokenizer and settings
        digest.update(str(problem.corpus.store.folder).encode())
    for name, tensor in encoder.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes())
    digest.update(repr(sorted(settings.items())).encode())
    return digest.hexdigest()


def load_window(run_dir: Path, fingerprint: str) -> MinedNegatives | None:
    """The window an earlier start of this run mined from the same inputs, or None."""
    path = run_dir / WINDOW_FILE
    if not path.is_file():
        return None
    try:
        kept = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # a damaged file is mined again, never read as data
        log.warning("%s is unreadable (%s): mining the window again", path, error)
        return None
    if kept.get("fingerprint") != fingerprint:
        log.info("%s was mined from other inputs (data, model or options changed): mining again", path)
        return None
    log.info("reusing the mined window of an earlier start of this run (%s): the teacher rescoring continues",
             path)
    return MinedNegatives(kept["indices"], kept["scores"], kept["positive_scores"],
                          int(kept["dropped_false_negatives"]), int(kept["short_rows"]),
                          int(kept.get("window_candidates", -1)))


def keep_window(run_dir: Path, fingerprint: str, mined: MinedNegatives) -> None:
    """Write the window atomically (rank 0 only: every rank holds the same one)."""
    blob = {"fingerprint": fingerprint, "indices": mined.indices, "scores": mined.scores,
            "positive_scores": mined.positive_scores, "dropped_false_negatives": mined.dropped_false_negatives,
            "short_rows": mined.short_rows, "window_candidates": mined.window_candidates}
    write_atomic(run_dir / WINDOW_FILE, lambda tmp: torch.save(blob, tmp))


def drop_window(run_dir: Path) -> None:
    (run_dir / WINDOW_FILE).unlink(missing_ok=True)
