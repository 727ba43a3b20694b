"""``data=beir``: a BEIR folder as training data (reading the folder: ``gte_pro.data.beir``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gte_pro.data.beir import beir_folder, read_beir_corpus, read_beir_qrels, read_beir_queries
from gte_pro.data.cache import file_signature
from gte_pro.data.records import MAX_TEXT_CHARS, CleaningReport, Example, clean_text
from gte_pro.data.sources import RowSource
from gte_pro.errors import DataError

if TYPE_CHECKING:
    from gte_pro.data.token_cache import TokenCache


def beir_examples(queries: Mapping[str, str], corpus: Mapping[str, str],
                  qrels: Mapping[str, Mapping[str, int]]) -> list[Example]:
    """One training row per query: all its documents of score > 0 are positives (each epoch draws one)."""
    rows = []
    for query_id, judged in qrels.items():
        positives = [corpus[doc] for doc, score in judged.items() if score > 0]
        if positives:
            rows.append(Example(queries[query_id], positives))
    return rows


class BeirRows(RowSource):
    """Train on ``qrels/<train_split>.tsv`` of a BEIR folder; validate on its first existing ``val_splits`` split
    over the whole corpus (or, if none exists, on ``val_fraction`` of the training queries).

    Texts are cleaned like every training source; for the canonical numbers name the folder in ``eval.beir``.
    """

    module_name = "BeirDataModule"

    def __init__(self, *, path: str, train_split: str, val_splits: Sequence[str] | str | None,
                 max_distractors: int | None) -> None:
        if not path:
            raise DataError("data.path (a BEIR folder) is required with data=beir")
        self.path = str(Path(path).expanduser())
        self.train_split = train_split
        # one split name is a list of one (list("dev") would be three one-letter splits)
        self.val_splits = [val_splits] if isinstance(val_splits, str) else list(val_splits or [])
        self.max_distractors = max_distractors

    def where(self) -> str:
        return self.path

    def signature(self, tokens: TokenCache) -> Any:
        return file_signature(beir_folder(self.path))

    def _rows(self, split: str, queries: dict[str, str], corpus: dict[str, str],
              tokens: TokenCache) -> Iterator[Example]:
        """The cleaned rows of one split; the report also counts repeated qrels lines."""
        source = f"{self.path}/qrels/{split}.tsv"
        report = CleaningReport(source)
        rows = beir_examples(queries, corpus, read_beir_qrels(self.path, split, queries, corpus, report.cleaned))
        if not rows:
            raise DataError(f"{source}: no query has a relevant document (score > 0)")
        return tokens.clean(rows, report)

    def load_rows(self, tokens: TokenCache) -> tuple[Iterable[Example], Iterable[Example] | None, list[str]]:
        corpus_ids, corpus_texts = read_beir_corpus(self.path)
        corpus = dict(zip(corpus_ids, corpus_texts, strict=True))
        queries = read_beir_queries(self.path)
        train = self._rows(self.train_split, queries, corpus, tokens)
        val_split = next((s for s in self.val_splits if s != self.train_split
                          and (Path(self.path) / "qrels" / f"{s}.tsv").is_file()), None)
        val = self._rows(val_split, queries, corpus, tokens) if val_split else None
        # the rest of the corpus competes with the positives, as in a BEIR evaluation
        distractors = [t for t in (clean_text(t[:MAX_TEXT_CHARS]) for t in corpus_texts) if t][: self.max_distractors]
        return train, val, distractors
