"""Teacher scores for distillation: FlagEmbedding's ``pos_scores`` (one per positive) and ``neg_scores`` (one per
negative), read with a row's texts and kept paired with them.

A row's scores are checked against its own texts as written (before cleaning): numbers (not booleans), finite, as
many as the texts of that field. A file is scored or not as a whole: a row without scores in a file whose first
row has them (or the reverse) is an error naming the line, since silently training such rows without a teacher
would change the loss of some batches only. Cleaning then drops a score together with its text
(``gte_pro.data.records.iter_clean_examples``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from gte_pro.errors import DataError

SCORE_FIELDS = ("pos_scores", "neg_scores")


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _score_list(value: Any, where: str, name: str, texts: list[str], text_field: str) -> list[float]:
    if _number(value):
        value = [value]
    if not isinstance(value, list):
        raise DataError(f"{where}: field '{name}' must be a list of numbers, got {_type_name(value)}")
    for i, item in enumerate(value):
        if not _number(item):
            raise DataError(f"{where}: field '{name}' must be a list of numbers; item {i} is {_type_name(item)}")
        if not math.isfinite(item):
            raise DataError(f"{where}: field '{name}': item {i} is {item}, expected a finite number")
    if len(value) != len(texts):
        raise DataError(f"{where}: field '{name}' has {len(value)} score(s) for the {len(texts)} text(s) of "
                        f"'{text_field}': give one score per text, in the same order")
    return [float(item) for item in value]


def parse_scores(record: Mapping[str, Any], positives: list[str], negatives: list[str], where: str,
                 fields: tuple[str, str], label: Callable[[str], str]
                 ) -> tuple[list[float] | None, list[float] | None]:
    """(pos_scores, neg_scores) of one record, or (None, None) if it has none. ``fields`` names the record's text
    fields (positive, negatives) in errors. ``neg_scores`` may be left out of a row without negatives."""
    pos, neg = (record.get(name) for name in SCORE_FIELDS)  # a null column (data=hf) counts as missing
    if pos is None and neg is None:
        return None, None
    if pos is None:
        raise DataError(f"{where}: missing field '{label('pos_scores')}' (the row has "
                        f"'{label('neg_scores')}': teacher scores need both)")
    if neg is None and negatives:
        raise DataError(f"{where}: missing field '{label('neg_scores')}' (the row has "
                        f"'{label('pos_scores')}' and {len(negatives)} negative(s): teacher scores need both)")
    pos_scores = _score_list(pos, where, label("pos_scores"), positives, fields[0])
    neg_scores = [] if neg is None else _score_list(neg, where, label("neg_scores"), negatives, fields[1])
    return pos_scores, neg_scores


class ScoredFile:
    """Checks that every row of one file (or dataset split) has teacher scores, or none does."""

    def __init__(self) -> None:
        self.first: tuple[str, bool] | None = None  # (where, scored) of the first row

    def check(self, scored: bool, where: str) -> None:
        if self.first is None:
            self.first = (where, scored)
            return
        first_where, first_scored = self.first
        if scored == first_scored:
            return
        if first_scored:
            raise DataError(f"{where}: missing field 'pos_scores' ({first_where} has teacher scores: every row of a "
                            f"file with pos_scores/neg_scores needs them)")
        raise DataError(f"{where}: field 'pos_scores' present, but {first_where} has no teacher scores: give "
                        f"pos_scores/neg_scores on every row of the file or on none")
