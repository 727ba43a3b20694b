"""An embedder teacher rescoring a mined window: pairs/s when each batch of pairs embeds its own texts (the route
before issue 31, still the route of a cross-encoder) vs each distinct text embedded once per job
(``gte_pro.scoring.pair_scoring.embedder_scores``, what ``mode=mine mine.rescore_with=`` and ``mode=score`` do now).

The job is the real one: ``--rows`` demo training pairs, the packaged all-MiniLM-L6-v2 (the student) mines each
query's candidate window ``[--range-min, --range-max)`` (``gte_pro.mining.rescore.window_options``), and the pairs
to score are each query's positives and its window, as ``rescore_window`` builds them. The teacher is ``--teacher``
(a folder; default all-mpnet-base-v2 after ``make fetch-mpnet``, else the packaged MiniLM).

- **per batch** (before): the pairs sorted by characters, cut into batches of ``--batch-size``, each batch through
  ``EmbedderTeacher.score`` (which embeds the batch's distinct texts). At 16 pairs/s the whole window would take over
  an hour, so ``--sample-pairs`` pairs are timed, whole batches taken evenly across the length order (long and short
  alike), and the rate is theirs; the full job's time is extrapolated from it;
- **embed once** (now): ``teacher_scores`` over the whole job, timed to the end.

The sampled pairs' scores from both routes must agree (max abs difference printed), so the speed-up compares two
routes to the same numbers. One process; the two routes run one after the other, on the same machine.

    make bench-teacher-speed                         # or: ARGS="--rows 2000 --range-min 10 --range-max 50"
"""

from __future__ import annotations

import os

os.environ.setdefault("TQDM_DISABLE", "1")

from pathlib import Path  # noqa: E402

import harness  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from harness import Column  # noqa: E402

from gte_pro import packaged_minilm_path  # noqa: E402
from gte_pro.config.defaults import default_mining_options  # noqa: E402
from gte_pro.mining.embed import mine_texts  # noqa: E402
from gte_pro.mining.problem import build_problem  # noqa: E402
from gte_pro.mining.rescore import window_options  # noqa: E402
from gte_pro.models.encoder import Encoder  # noqa: E402
from gte_pro.models.teacher import EmbedderTeacher, load_teacher  # noqa: E402
from gte_pro.scoring.pair_scoring import teacher_scores  # noqa: E402
from gte_pro.utils.cache import cache_root  # noqa: E402

PER_BATCH, ONCE = "per batch (before)", "each text once (now)"


def default_teacher() -> str:
    mpnet = cache_root() / "models" / "all-mpnet-base-v2"
    return str(mpnet) if mpnet.is_dir() else packaged_minilm_path()


def window_pairs(rows: list, range_min: int, range_max: int, batch_size: int, max_length: int):
    """The job of ``rescore_window``: (queries, corpus, query_of, doc_of) for each positive and window candidate."""
    problem = build_problem(rows)
    student = Encoder.load(packaged_minilm_path(), max_length=max_length, length_chunks=1).eval()
    options = window_options(default_mining_options(range_max - range_min, range_min, range_max))
    window = mine_texts(student, problem.queries, problem.corpus, problem.positives, options, batch_size, max_length)
    ids = window.indices.cpu()
    counts = [len(p) for p in problem.positives]
    win_row, win_col = (t.numpy() for t in torch.nonzero(ids >= 0, as_tuple=True))
    query_of = np.concatenate([np.repeat(np.arange(len(counts)), counts), win_row])
    doc_of = np.concatenate([np.fromiter((d for p in problem.positives for d in p), dtype=np.int64),
                             ids[win_row, win_col].numpy()])
    return problem.queries, problem.corpus, query_of.astype(np.int64), doc_of.astype(np.int64)


def sampled_batches(queries, corpus, query_of, doc_of, batch_size: int, sample_pairs: int) -> list[np.ndarray]:
    """Whole batches of the per-batch route's length order, evenly spaced, ~``sample_pairs`` pairs in all."""
    chars = np.array([len(queries[q]) + len(corpus[d]) for q, d in zip(query_of, doc_of, strict=True)])
    order = np.lexsort((np.arange(len(chars)), -chars))
    batches = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    step = max(1, len(batches) * batch_size // max(sample_pairs, 1))
    return batches[::step]


def per_batch(teacher: EmbedderTeacher, queries, corpus, query_of, doc_of, batches, batch_size: int):
    with harness.timed() as timing:
        scores = [teacher.score([queries[q] for q in query_of[b]], [corpus[d] for d in doc_of[b]], batch_size)
                  for b in batches]
    return torch.cat(scores).float(), timing


def main(argv: list[str] | None = None) -> None:
    parser = harness.add_common(harness.parser(__doc__), batch_size=64, max_length=256, timeout_of=None,
                                cache_dir=True, json="write the figures to this file")
    parser.add_argument("--rows", type=int, default=2000, help="demo training pairs (queries)")
    parser.add_argument("--range-min", type=int, default=10)
    parser.add_argument("--range-max", type=int, default=50)
    parser.add_argument("--teacher", default=None, help="an embedder folder (default: all-mpnet-base-v2 if fetched)")
    parser.add_argument("--sample-pairs", type=int, default=2000, help="pairs timed on the per-batch route")
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = harness.demo_splits(args.cache_dir).train[: args.rows]
    queries, corpus, query_of, doc_of = window_pairs(rows, args.range_min, args.range_max, args.batch_size,
                                                     args.max_length)
    teacher_path = args.teacher or default_teacher()
    teacher = load_teacher(teacher_path, args.max_length, kind="embedder")
    # first-call allocations stay out of the timings
    teacher.score([queries[i] for i in range(8)], [corpus[i] for i in range(8)])
    batches = sampled_batches(queries, corpus, query_of, doc_of, args.batch_size, args.sample_pairs)
    sample = np.concatenate(batches)
    before, before_time = per_batch(teacher, queries, corpus, query_of, doc_of, batches, args.batch_size)
    with harness.timed() as after_time:
        after = teacher_scores(teacher, queries, corpus, query_of, doc_of, args.batch_size)
    distinct = len(set(queries[q] for q in query_of)) + len(set(corpus[d] for d in doc_of))
    rows_out = [
        {"route": PER_BATCH, "pairs": len(sample), "seconds": before_time.wall_s, "cpu_s": before_time.cpu_s,
         "pairs_per_s": len(sample) / before_time.wall_s,
         "job_s": len(query_of) * before_time.wall_s / len(sample)},
        {"route": ONCE, "pairs": len(query_of), "seconds": after_time.wall_s, "cpu_s": after_time.cpu_s,
         "pairs_per_s": len(query_of) / after_time.wall_s, "job_s": after_time.wall_s}]
    difference = float((after[torch.from_numpy(sample)] - before).abs().max())
    print(f"{len(queries)} demo queries, {len(corpus)} corpus documents, window [{args.range_min}, {args.range_max}) "
          f"mined by all-MiniLM-L6-v2: {len(query_of)} pairs, {distinct} distinct texts; teacher "
          f"{Path(teacher_path).name}, batch {args.batch_size}, max_length {args.max_length}; per-batch route timed "
          f"on {len(sample)} sampled pairs; max |score difference| on them {difference:.2e}\n{harness.machine()}\n")
    print(harness.table([
        Column("route", "route", numeric=False, key=True), Column("pairs timed", "pairs", "d"),
        Column("wall s", "seconds", ".1f"), Column("CPU s", "cpu_s", ".1f"), Column("pairs/s", "pairs_per_s", ".1f"),
        Column("whole job, s", "job_s", ".0f"),
        Column("speed-up", lambda r: harness.ratio(r["pairs_per_s"], rows_out[0]["pairs_per_s"]))], rows_out), end="")
    harness.save(args, rows=rows_out, max_abs_difference=difference, distinct_texts=distinct, teacher=teacher_path)


if __name__ == "__main__":
    main()
