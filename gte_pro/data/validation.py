"""What a data module serves besides training batches: its validation sets (the held-out split first, then the
named ``eval.beir`` sets) as loaders of token ids for an embedder, or, for a reranker (``task=rerank``), of each
query's candidate pairs (``Validation``, one part of a data module).

The held-out split is searched over every document of the data, not only over the held-out positives: the training
rows' positives and negatives join its corpus as distractors (``data.val_distractors`` of them at most). A held-out
query found among a hundred documents is found by any model (NDCG@10 ~0.98 before training), and a validation that
scores every recipe alike cannot pick the best checkpoint, stop early or rank a sweep. ``validation_warnings`` says
when the split is still too small or too easy to tell recipes apart, and what gives a better one.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader

from gte_pro.data.cache import TokenizedCache
from gte_pro.data.collaborators import CandidateSource, EvalSetSource, PairJoiner
from gte_pro.data.collate import CandidateCollator, EvalCollator
from gte_pro.data.datasets import CandidatePairs, EvalTextsCache
from gte_pro.data.records import Example
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)

# a held-out split below these sizes, or this good before training, cannot tell recipes apart: the log says so
MIN_VAL_QUERIES = 100
MIN_VAL_DOCUMENTS = 1000
SATURATED_NDCG = 0.95
BETTER_VALIDATION = ("a larger, harder validation: data.val_file=<a file of held-out rows>, "
                     "eval.beir=[<a BEIR folder>], or more distractors (data.val_distractors=null: every document)")
_ROWS_PER_READ = 1024


def training_distractors(cache: TokenizedCache, limit: int | None, known: Iterable[str] = ()) -> list[str]:
    """Up to ``limit`` distinct documents of the training rows (each row's positives, then its negatives) that are
    not in ``known``; None: all of them. The rows are read in one fixed pseudo-random order (seed 0, whatever
    ``data.seed`` is): every run on the same data validates on the same corpus, and a capped corpus samples the
    whole data, not its first rows."""
    if limit == 0 or not len(cache):
        return []
    order = np.random.default_rng(0).permutation(len(cache))
    seen, found = set(known), {}
    for start in range(0, len(order), _ROWS_PER_READ):
        for text in cache.documents(order[start:start + _ROWS_PER_READ]):
            if text not in seen:
                found.setdefault(text, None)
                if limit is not None and len(found) >= limit:
                    return list(found)
    return list(found)


def held_out_set(cache: TokenizedCache, val: Sequence[Example], distractors: Sequence[str],
                 val_distractors: int | None) -> RetrievalSet:
    """The held-out split as a retrieval set: its queries searched over its own documents, ``distractors`` (a
    source's, e.g. a BEIR corpus's) and up to ``val_distractors`` documents of the training rows; logged with its
    size, and with a warning when it is too small to tell recipes apart."""
    known = {text for ex in val for text in (*ex.positives, *ex.negatives)} | set(distractors)
    added = training_distractors(cache, val_distractors, known)
    retrieval = RetrievalSet.from_examples(val, [*distractors, *added])
    log.info("data: %d training pairs (token cache %s); validation: %d queries over a corpus of %d documents "
             "(%d of them from the training rows)", len(cache), cache.folder, len(retrieval.queries),
             len(retrieval.corpus), len(added))
    for line in validation_warnings(retrieval):
        log.warning("%s", line)
    return retrieval


def validation_warnings(retrieval: RetrievalSet, name: str = "held-out split") -> list[str]:
    """What makes this validation set unable to tell recipes apart, as lines for the log (none: fine)."""
    queries, documents = len(retrieval.queries), len(retrieval.corpus)
    if queries >= MIN_VAL_QUERIES and documents >= MIN_VAL_DOCUMENTS:
        return []
    return [f"validation: the {name} has {queries} queries over {documents} documents (fewer than "
            f"{MIN_VAL_QUERIES} queries or {MIN_VAL_DOCUMENTS} documents): its NDCG@10 moves by whole queries and "
            f"cannot tell close recipes apart (early stopping, best checkpoints and sweeps select on it); for "
            f"{BETTER_VALIDATION}"]


def saturation_warnings(before: dict[str, float]) -> list[str]:
    """Validation sets whose NDCG@10 before training is already at the top: the run cannot show a gain on them."""
    lines = []
    for key, value in before.items():
        if key.endswith("/ndcg@10") and value >= SATURATED_NDCG:
            where = key.removesuffix("/ndcg@10").removeprefix("val").strip("/") or "held-out split"
            lines.append(f"validation: NDCG@10 {value:.4f} on the {where} before training (>= {SATURATED_NDCG}): "
                         "it is saturated and cannot tell recipes apart (early stopping, best checkpoints and sweeps "
                         f"select on it); for {BETTER_VALIDATION}")
    return lines


class Validation:
    """A data module's validation sets after its held-out split: the named sets (``eval_sets``: ``eval.beir``,
    loaded the first time they are asked for, or handed in by ``add_eval_sets``), and the loaders of each set:
    token ids for an embedder, or for a reranker (``task=rerank``) each query's candidate pairs (``candidates``,
    found by the reranker's module; joined by its ``pair_join``)."""

    def __init__(self, *, eval_batch_size: int, val_distractors: int | None, loader: Any,
                 pair_join: PairJoiner | None, candidates: CandidateSource | None,
                 eval_sets: EvalSetSource | None) -> None:
        self.eval_batch_size = eval_batch_size
        self.val_distractors = val_distractors
        self.loader_options = loader  # gte_pro.data.batching.LoaderOptions
        self.pair_join = pair_join
        self.candidate_source = candidates
        self._eval_set_source = eval_sets
        self._named: list[tuple[str, RetrievalSet]] = []
        self.named_batch_size: int | None = None  # None: eval_batch_size
        self.named_max_length: int | None = None  # None: the data's max_length
        self._eval_texts = EvalTextsCache()

    def held_out(self, cache: TokenizedCache, val: Sequence[Example], distractors: Sequence[str]) -> RetrievalSet:
        """The held-out split over its documents, ``distractors`` and up to ``val_distractors`` training
        documents (``held_out_set``)."""
        return held_out_set(cache, val, distractors, self.val_distractors)

    def add_eval_sets(self, sets: Sequence[tuple[str, RetrievalSet]], batch_size: int | None = None,
                      max_length: int | None = None) -> None:
        """Named retrieval sets (e.g. BEIR folders) validated after the held-out split, each logged on its own."""
        self._named = list(sets)
        self.named_batch_size, self.named_max_length = batch_size, max_length

    def named_sets(self, form: Any) -> list[tuple[str, RetrievalSet]]:
        """The named sets (``eval_sets``, loaded here with ``form``'s tokenizer the first time they are asked for;
        ``form``: a ``gte_pro.data.token_cache.Tokenization``)."""
        if self._eval_set_source is not None:
            source, self._eval_set_source = self._eval_set_source, None
            self.add_eval_sets(source.load(form.tokenizer, form.doc_prefix, form.max_length), source.batch_size,
                               source.max_length)
        return self._named

    def loader(self, index: int, retrieval: RetrievalSet, batch_size: int, max_length: int, form: Any,
               query_prefix: str | None = None) -> DataLoader:
        """The loader of validation set ``index``; ``query_prefix``: the set's own (a mix's source), else
        ``form``'s."""
        prefix = form.query_prefix if query_prefix is None else query_prefix
        texts = self._eval_texts.get(form.tokenizer, retrieval, max_length, prefix, form.doc_prefix)
        if self.candidate_source is not None:  # task=rerank: (query, candidate) pairs instead of texts
            assert self.pair_join is not None, "a reranker's validation needs its pair_join"
            items: Any = CandidatePairs(texts, self.candidate_source.candidates(index))
            collate: Any = CandidateCollator(self.pair_join)
        else:
            items, collate = texts, EvalCollator(form.tokenizer)
        return DataLoader(items, batch_size=batch_size, collate_fn=collate, **self.loader_options.kwargs())

    def loaders(self, first: list[tuple[RetrievalSet, int, int, str | None]], form: Any) -> list[DataLoader]:
        """The loaders of ``first`` (each: a set, its batch size, max_length and query prefix), then of the named
        sets, in val-dataloader order."""
        loaders = [self.loader(index, retrieval, batch_size, max_length, form, prefix)
                   for index, (retrieval, batch_size, max_length, prefix) in enumerate(first)]
        batch_size = self.named_batch_size or self.eval_batch_size
        max_length = self.named_max_length or form.max_length
        return loaders + [self.loader(index, retrieval, batch_size, max_length, form)
                          for index, (_, retrieval) in enumerate(self.named_sets(form), start=len(first))]
