"""``data=demo``, the offline demo corpus: (docstring summary line -> docstring body) pairs of the Python
standard library.

The source files are parsed with ``ast`` (nothing is imported, so no module's side effects run). The task is
real retrieval: given the one-line summary of a function, class or module, find the paragraph(s) that describe
it in detail among thousands of others written in the same style.
"""

from __future__ import annotations

import ast
import hashlib
import json
import logging
import sys
import sysconfig
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gte_pro.data.docstrings import docstring_pair, parsed_sources
from gte_pro.data.records import CleaningReport, Example, clean_examples, clean_text
from gte_pro.data.sources import RowSource
from gte_pro.data.split import is_held_out, split_bucket
from gte_pro.utils.files import write_atomic
from gte_pro.utils.shared_cache import seal, shared_file

if TYPE_CHECKING:
    from gte_pro.data.token_cache import TokenCache

log = logging.getLogger(__name__)

# test suites and demos repeat the library's own docstrings and add noise; site-packages is not the stdlib
_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip", "__pycache__"}
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def stdlib_docstrings(stdlib_dir: str | Path | None = None) -> tuple[list[Example], list[str]]:
    """Raw (uncleaned) pairs and one-paragraph docstrings of every stdlib module, in a deterministic order."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    examples: list[Example] = []
    distractors: list[str] = []
    for _, tree in parsed_sources(root, _SKIP_PARTS):
        for node in ast.walk(tree):
            if isinstance(node, _DOC_NODES):
                doc = ast.get_docstring(node, clean=True)
                pair = docstring_pair(doc) if doc else None
                if pair:
                    examples.append(Example(query=pair[0], positives=[pair[1]]))
                elif doc:
                    # a summary-only docstring has no query but makes a realistic distractor document
                    distractors.append(doc)
    return examples, distractors


@dataclass
class DemoSplits:
    train: list[Example]
    val: list[Example]
    distractors: list[str]
    reports: list[dict]


def _drop_ambiguous_queries(examples: list[Example], report: CleaningReport) -> list[Example]:
    """'Emit a record.' summarises eleven different methods: such a query has no single right answer."""
    counts = Counter(ex.query for ex in examples)
    kept = [ex for ex in examples if counts[ex.query] == 1]
    if len(kept) < len(examples):
        report.dropped["ambiguous query (same summary, other bodies)"] += len(examples) - len(kept)
        report.kept = len(kept)
    return kept


def build_demo_splits(*, val_fraction: float, min_query_chars: int, min_doc_chars: int,
                      max_distractors: int | None) -> DemoSplits:
    """Clean, de-duplicate and split the stdlib pairs; the split is a hash of the query, so it never drifts."""
    raw, raw_distractors = stdlib_docstrings()
    pairs, report = clean_examples(raw, "demo (stdlib docstrings)", min_query_chars, min_doc_chars)
    pairs = _drop_ambiguous_queries(pairs, report)
    train = [ex for ex in pairs if not is_held_out(ex.query, val_fraction)]
    val = [ex for ex in pairs if is_held_out(ex.query, val_fraction)]
    used = {p for ex in pairs for p in ex.positives}
    distractors = sorted({d for d in map(clean_text, raw_distractors) if len(d) >= min_doc_chars} - used,
                         key=split_bucket)[:max_distractors]
    return DemoSplits(train, val, distractors, [report.as_dict()])


def load_demo_splits(cache_dir: str | Path, **options) -> DemoSplits:
    """The demo splits from ``cache_dir``, building and caching them (atomically) on first use. The file is sealed
    with its size and checksum (``shared_cache.seal``): processes that need it at once build it once, and a damaged
    file is rebuilt, never read."""
    # format 2: the sealed file (a checksum header line); the plain JSON of format 1 has another name
    key = hashlib.sha1(json.dumps({**options, "format": 2}, sort_keys=True).encode()).hexdigest()[:8]
    path = Path(cache_dir).expanduser() / f"demo_stdlib_py{sys.version_info.major}{sys.version_info.minor}_{key}.json"
    blob = json.loads(shared_file(path, lambda target: _build_demo_file(target, options), "demo corpus"))
    as_examples = lambda rows: [Example(q, [p]) for q, p in rows]  # noqa: E731
    return DemoSplits(as_examples(blob["train"]), as_examples(blob["val"]), blob["distractors"], blob["reports"])


def _build_demo_file(path: Path, options: dict[str, Any]) -> None:
    splits = build_demo_splits(**options)
    blob = {
        "train": [[ex.query, ex.positives[0]] for ex in splits.train],
        "val": [[ex.query, ex.positives[0]] for ex in splits.val],
        "distractors": splits.distractors,
        "reports": splits.reports,
    }
    write_atomic(path, lambda tmp: tmp.write_bytes(seal(json.dumps(blob).encode())))
    log.info("demo data cached at %s", path)


class DemoRows(RowSource):
    """Summary line -> body pairs from the Python standard library's docstrings; works offline anywhere. The corpus
    is built (and cached beside the token caches) with the token cache's cleaning and split settings."""

    module_name = "DemoDataModule"

    def __init__(self, *, max_distractors: int | None) -> None:
        self.max_distractors = max_distractors

    def _options(self, tokens: TokenCache) -> dict[str, Any]:
        return {"val_fraction": tokens.val_fraction, "min_query_chars": tokens.min_query_chars,
                "min_doc_chars": tokens.min_doc_chars, "max_distractors": self.max_distractors}

    def signature(self, tokens: TokenCache) -> Any:
        # the corpus is a pure function of the Python version's standard library and these options
        return {"demo": sys.version, **self._options(tokens)}

    def load_rows(self, tokens: TokenCache) -> tuple[list[Example], list[Example] | None, list[str]]:
        splits = load_demo_splits(tokens.cache_dir, **self._options(tokens))
        for report in splits.reports:
            tokens.record(report)
        return splits.train, splits.val, splits.distractors
