"""BEIR-format folders: reading them (for ``eval.beir``, see ``gte_pro.evaluation.sets``, and ``data=beir``:
``gte_pro.data.beir_rows``).

A BEIR folder holds ``corpus.jsonl`` ({"_id", "title", "text"} per line), ``queries.jsonl`` ({"_id", "text"}) and
``qrels/<split>.tsv`` (tab-separated, header ``query-id corpus-id score``). As in sentence-transformers'
``InformationRetrievalEvaluator`` relevance is binary (score > 0) and a document is ``title + " " + text``.
Every error names the file, the line and the offending id.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Container, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gte_pro.data.records import (
    MAX_TEXT_CHARS,
    iter_jsonl,
    iter_text_lines,
    type_name,
)
from gte_pro.errors import CHECK_PATH, DataError
from gte_pro.retrieval import RetrievalSet

log = logging.getLogger(__name__)

QRELS_HEADER = ("query-id", "corpus-id", "score")
_SURROGATES = re.compile("[\ud800-\udfff]")  # \ud800 escapes in JSON decode to these; no tokenizer accepts them
_SCORE = re.compile(r"[+-]?[0-9]+")


@dataclass
class BeirSet(RetrievalSet):
    """A RetrievalSet that keeps the folder's string ids (query i is ``query_ids[i]``, document j ``corpus_ids[j]``)."""

    name: str = ""
    query_ids: list[str] = field(default_factory=list)
    corpus_ids: list[str] = field(default_factory=list)
    # what reading changed or noticed (cut or repaired texts, empty texts, repeated qrels lines), counted
    anomalies: Counter = field(default_factory=Counter)


# --- reading the three files -------------------------------------------------------------------------------------
def beir_folder(path: str | Path) -> Path:
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise DataError(f"{folder}: not a BEIR folder (no such directory; expected corpus.jsonl, queries.jsonl, "
                        f"qrels/<split>.tsv)", hint=CHECK_PATH)
    return folder


def _string_field(record: Any, key: str, where: str, required: bool = True) -> str:
    if not isinstance(record, dict):
        raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    value = record.get(key)
    if value is None and not required:
        return ""
    if key == "_id" and isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # some exports write numeric ids; qrels name them as text
    if key not in record:
        raise DataError(f"{where}: field '{key}' is missing")
    if not isinstance(value, str):
        raise DataError(f"{where}: field '{key}' must be a string, got {type_name(value)}")
    if key == "_id" and not value.strip():
        raise DataError(f"{where}: field '_id' is empty")
    return value


def _read_jsonl_ids(path: Path, text_of: Any) -> Iterator[tuple[str, str]]:
    """(id, text) per line; duplicate ids are an error naming both lines."""
    first_line: dict[str, int] = {}
    for line_no, record in iter_jsonl(path):
        where = f"{path}, line {line_no}"
        doc_id = _string_field(record, "_id", where)
        if doc_id in first_line:
            raise DataError(f"{where}: duplicate _id '{doc_id}' (first on line {first_line[doc_id]})")
        first_line[doc_id] = line_no
        yield doc_id, text_of(record, where, doc_id)


def _document_text(record: dict, where: str, doc_id: str) -> str:
    title = _string_field(record, "title", f"{where} (_id '{doc_id}')", required=False)
    text = _string_field(record, "text", f"{where} (_id '{doc_id}')")
    return f"{title} {text}".strip() if title else text


def _query_text(record: dict, where: str, query_id: str) -> str:
    return _string_field(record, "text", f"{where} (_id '{query_id}')")


def read_beir_corpus(folder: str | Path) -> tuple[list[str], list[str]]:
    """(ids, texts) of ``corpus.jsonl`` in file order."""
    pairs = list(_read_jsonl_ids(beir_folder(folder) / "corpus.jsonl", _document_text))
    if not pairs:
        raise DataError(f"{Path(folder) / 'corpus.jsonl'}: no documents")
    return [doc_id for doc_id, _ in pairs], [text for _, text in pairs]


def read_beir_queries(folder: str | Path) -> dict[str, str]:
    """id -> text of ``queries.jsonl`` (all splits' queries; the qrels say which belong to a split)."""
    return dict(_read_jsonl_ids(beir_folder(folder) / "queries.jsonl", _query_text))


def beir_splits(folder: str | Path) -> list[str]:
    return sorted(p.stem for p in (Path(folder).expanduser() / "qrels").glob("*.tsv"))


def _qrels_rows(path: Path) -> Iterator[tuple[str, int, list[str]]]:
    """(where, line number, 3 columns) per data line, after checking the header."""
    lines = ((n, line.rstrip("\r\n")) for n, line in iter_text_lines(path) if line.strip())
    header = next(lines, None)
    if header is None or tuple(header[1].split()) != QRELS_HEADER:
        got = repr(header[1][:80]) if header else "an empty file"
        raise DataError(f"{path}, line {header[0] if header else 1}: expected the header "
                        f"'query-id<TAB>corpus-id<TAB>score', got {got}")
    for line_no, line in lines:
        columns = line.split("\t") if line.count("\t") == 2 else line.split()
        if len(columns) != 3:
            raise DataError(f"{path}, line {line_no}: expected 3 tab-separated columns "
                            f"(query-id, corpus-id, score), got {len(columns)}")
        yield f"{path}, line {line_no}", line_no, columns


class _EveryId:
    def __contains__(self, doc_id: object) -> bool:
        return True


_EVERY_ID = _EveryId()


def qrels_path(folder: str | Path, split: str) -> Path:
    folder = beir_folder(folder)
    path = folder / "qrels" / f"{split}.tsv"
    if not path.is_file():
        splits = ", ".join(beir_splits(folder)) or "none"
        raise DataError(f"{path}: file not found (splits in {folder}: {splits})", hint=CHECK_PATH)
    return path


def read_beir_qrels(folder: str | Path, split: str, query_ids: Iterable[str], corpus_ids: Container[str] | None,
                    anomalies: Counter | None = None) -> dict[str, dict[str, int]]:
    """query id -> {corpus id: score} of ``qrels/<split>.tsv``; every id must exist in queries/corpus (``corpus_ids``
    None: not checked here, the caller does). A pair judged twice with the same score is counted in ``anomalies``;
    with two scores it is an error naming both lines."""
    path = qrels_path(folder, split)
    known_queries = set(query_ids)
    known_docs = _EVERY_ID if corpus_ids is None else corpus_ids
    qrels: dict[str, dict[str, int]] = {}
    first_line: dict[tuple[str, str], int] = {}
    for where, line_no, (query_id, doc_id, score) in _qrels_rows(path):
        if query_id not in known_queries:
            raise DataError(f"{where}: query-id '{query_id}' is not in queries.jsonl")
        if doc_id not in known_docs:
            raise DataError(f"{where}: corpus-id '{doc_id}' is not in corpus.jsonl")
        if not _SCORE.fullmatch(score):
            raise DataError(f"{where}: score '{score}' of query-id '{query_id}' is not an integer")
        judged = qrels.setdefault(query_id, {})
        if doc_id in judged:
            first = first_line[query_id, doc_id]
            if judged[doc_id] != int(score):
                raise DataError(f"{where}: query-id '{query_id}', corpus-id '{doc_id}' judged again with score "
                                f"{score} (score {judged[doc_id]} on line {first})")
            if anomalies is not None:
                anomalies["qrels line repeated (same ids and score) ignored"] += 1
            continue
        judged[doc_id] = int(score)
        first_line[query_id, doc_id] = line_no
    return qrels


def _usable_text(text: str, what: str, anomalies: Counter) -> str:
    """An evaluation text as the evaluator would see it, except what no tokenizer takes: cut at MAX_TEXT_CHARS
    (far beyond any max_length) and unpaired surrogates replaced; each change (and an empty text) is counted."""
    if len(text) > MAX_TEXT_CHARS:
        text = text[:MAX_TEXT_CHARS]
        anomalies[f"{what} cut at {MAX_TEXT_CHARS:,} chars"] += 1
    if _SURROGATES.search(text):
        text = _SURROGATES.sub("\ufffd", text)
        anomalies[f"{what} with unpaired surrogates (invalid Unicode) replaced"] += 1
    if not text.strip():
        anomalies[f"empty {what}"] += 1
    return text


def load_beir(folder: str | Path, split: str = "test", name: str | None = None) -> BeirSet:
    """One split of a BEIR folder: the queries with at least one relevant document, over the whole corpus."""
    folder = beir_folder(folder)
    qrels_path(folder, split)  # a wrong split name fails before a large corpus is read
    anomalies: Counter = Counter()
    corpus_ids, corpus_texts = read_beir_corpus(folder)
    queries = read_beir_queries(folder)
    index = {doc_id: j for j, doc_id in enumerate(corpus_ids)}
    qrels = read_beir_qrels(folder, split, queries, index, anomalies)
    corpus = [_usable_text(text, "document", anomalies) for text in corpus_texts]
    return beir_set(folder, split, name, queries, qrels, index, corpus, anomalies, corpus_ids)


def iter_beir_documents(corpus_file: Path, anomalies: Counter) -> Iterator[tuple[int, str, str]]:
    """(line number, id, text) per document of ``corpus_file``, each text as evaluation sees it (``_usable_text``:
    changes counted in ``anomalies``). Duplicate ids are the caller's to find (a store keeps hashes, not ids)."""
    for line_no, record in iter_jsonl(corpus_file):
        where = f"{corpus_file}, line {line_no}"
        doc_id = _string_field(record, "_id", where)
        yield line_no, doc_id, _usable_text(_document_text(record, where, doc_id), "document", anomalies)


def beir_set(folder: Path, split: str, name: str | None, queries: Mapping[str, str],
             qrels: Mapping[str, Mapping[str, int]], index: Mapping[str, int], corpus: Sequence[str],
             anomalies: Counter, corpus_ids: list[str]) -> BeirSet:
    """The set of the queries with a relevant document (score > 0), ``index`` mapping corpus ids to positions."""
    # queries.jsonl order, like the evaluator; a query whose judgements are all 0 has nothing to find
    query_ids = [qid for qid in queries if any(score > 0 for score in qrels.get(qid, {}).values())]
    if not query_ids:
        raise DataError(f"{folder / 'qrels' / f'{split}.tsv'}: no query has a relevant document (score > 0)")
    relevant = [{index[doc] for doc, score in qrels[qid].items() if score > 0} for qid in query_ids]
    beir = BeirSet(queries=[_usable_text(queries[qid], "query", anomalies) for qid in query_ids], corpus=corpus,
                   relevant=relevant, name=name or folder.name, query_ids=query_ids, corpus_ids=corpus_ids,
                   anomalies=anomalies)
    log.info("BEIR %s (%s, split %s): %d queries, %d documents", beir.name, folder, split, len(query_ids),
             len(corpus))
    if anomalies:
        log.warning("BEIR %s: %s", beir.name, ", ".join(f"{what}: {n}" for what, n in anomalies.most_common()))
    return beir


def relevant_texts(path: str | Path, split: str) -> tuple[list[str], list[str]]:
    """(queries with a relevant document, the relevant documents) of a split: the corpus streamed, those kept."""
    folder, queries = beir_folder(path), read_beir_queries(path)
    qrels = read_beir_qrels(folder, split, queries, None)
    relevant = {doc for judged in qrels.values() for doc, score in judged.items() if score > 0}
    texts = [queries[qid] for qid, judged in qrels.items() if any(score > 0 for score in judged.values())]
    docs = [text for _, doc_id, text in iter_beir_documents(folder / "corpus.jsonl", Counter()) if doc_id in relevant]
    return texts, docs
