"""What higher floors hand a data module when it is built, as ``typing.Protocol`` classes: the data package names
the few methods it calls and imports none of the packages that implement them (mining, models, evaluation,
training). A data module is given its collaborators once, as constructor arguments (``gte_pro.modes.build``); no
module outside ``gte_pro.data`` sets attributes on it afterwards (``tests/test_structure.py`` holds that rule).

- ``NegativePool``: re-mined hard negatives (``gte_pro.mining.pool.NegativePool``, mined by
  ``gte_pro.mining.remine`` during training); the training dataset draws each row's negatives from it once a pool
  is active.
- ``PairJoiner``: a reranker's joining of cached (query, document) token ids into its inputs
  (``gte_pro.models.pairs.PairBatcher``); training batches and validation pairs are collated with it.
- ``CandidateSource``: each validation set's candidates for a reranker (``gte_pro.training.rerank_validation``),
  found by the reranker's module once the process group exists; validation then serves (query, candidate) pairs.
- ``EvalSetSource``: named retrieval sets validated after the held-out split (``eval.beir``,
  ``gte_pro.evaluation.sets``), loaded with the data module's tokenizer the first time they are needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from transformers import PreTrainedTokenizerBase

from gte_pro.retrieval import RetrievalSet

# the constructor arguments that carry collaborators (a mix hands its sources the other, shared ones)
COLLABORATORS = ("negative_pool", "pair_join", "candidates", "eval_sets")


class NegativePool(Protocol):
    negatives_per_row: int  # the most negatives a re-mined row carries (data.num_negatives=null counts them)

    def references(self, rows: list[int], epoch: int) -> list[list[tuple[int, int]]] | None:
        """Each row's negatives in the pool active for ``epoch`` as (row, positive index) references into the
        training rows; None while no pool is active."""
        ...


class PairJoiner(Protocol):
    def __call__(self, queries: Sequence[Sequence[int]], docs: Sequence[Sequence[int]]) -> dict[str, Any]:
        """The model inputs (padded ids, mask, token types) of the pairs ``(queries[i], docs[i])``."""
        ...


class CandidateSource(Protocol):
    def candidates(self, index: int) -> list[list[int]]:
        """Validation set ``index``'s candidates: each query's corpus positions, in the order they are scored."""
        ...


class EvalSetSource(Protocol):
    batch_size: int | None  # None: the data module's eval batch size
    max_length: int | None  # None: the data module's max_length

    def load(self, tokenizer: PreTrainedTokenizerBase | None, doc_prefix: str,
             max_length: int) -> Sequence[tuple[str, RetrievalSet]]:
        """The named sets, tokenized with ``tokenizer`` (documents prefixed with ``doc_prefix``)."""
        ...

    def texts(self) -> list[tuple[str, list[str], list[str]]]:
        """Per set: (name, its queries, the documents judged relevant), the texts ``data.decontaminate`` compares."""
        ...

    def signature(self) -> Any:
        """A JSON-able value that changes whenever ``texts`` would (the sets' names, splits and files)."""
        ...
