"""The offline demo corpus: (docstring summary line -> docstring body) pairs from the Python standard library.

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
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from gte_pro.data.records import CleaningReport, Example, clean_examples, clean_text

log = logging.getLogger(__name__)

# test suites and demos repeat the library's own docstrings and add noise; site-packages is not the stdlib
_SKIP_PARTS = {"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip", "__pycache__"}
_DOC_NODES = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _docstring_pair(doc: str) -> tuple[str, str] | None:
    """(summary paragraph, rest) of a docstring, or None when it has no body."""
    paragraphs = [p for p in doc.split("\n\n") if p.strip()]
    if len(paragraphs) < 2:
        return None
    return paragraphs[0], "\n\n".join(paragraphs[1:])


def stdlib_docstrings(stdlib_dir: str | Path | None = None) -> tuple[list[Example], list[str]]:
    """Raw (uncleaned) pairs and one-paragraph docstrings of every stdlib module, in a deterministic order."""
    root = Path(stdlib_dir or sysconfig.get_paths()["stdlib"])
    examples: list[Example] = []
    distractors: list[str] = []
    for path in sorted(root.rglob("*.py")):
        if _SKIP_PARTS.intersection(path.relative_to(root).parts):
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences in old sources
                tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, _DOC_NODES):
                doc = ast.get_docstring(node, clean=True)
                pair = _docstring_pair(doc) if doc else None
                if pair:
                    examples.append(Example(query=pair[0], positives=[pair[1]]))
                elif doc:
                    # a summary-only docstring has no query but makes a realistic distractor document
                    distractors.append(doc)
    return examples, distractors


def split_bucket(text: str, buckets: int = 1000) -> int:
    """A stable pseudo-random bucket (same on every machine and Python version, unlike ``hash``)."""
    return int.from_bytes(hashlib.sha1(text.encode("utf-8")).digest()[:4], "big") % buckets


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


def build_demo_splits(val_fraction: float = 0.1, min_query_chars: int = 10, min_doc_chars: int = 40,
                      max_distractors: int = 1000) -> DemoSplits:
    """Clean, de-duplicate and split the stdlib pairs; the split is a hash of the query, so it never drifts."""
    raw, raw_distractors = stdlib_docstrings()
    pairs, report = clean_examples(raw, "demo (stdlib docstrings)", min_query_chars, min_doc_chars)
    pairs = _drop_ambiguous_queries(pairs, report)
    cutoff = int(val_fraction * 1000)
    train = [ex for ex in pairs if split_bucket(ex.query) >= cutoff]
    val = [ex for ex in pairs if split_bucket(ex.query) < cutoff]
    used = {p for ex in pairs for p in ex.positives}
    distractors = sorted({d for d in map(clean_text, raw_distractors) if len(d) >= min_doc_chars} - used,
                         key=split_bucket)[:max_distractors]
    return DemoSplits(train, val, distractors, [report.as_dict()])


def load_demo_splits(cache_dir: str | Path, **options) -> DemoSplits:
    """The demo splits from ``cache_dir``, building and caching them (atomically) on first use."""
    key = hashlib.sha1(json.dumps(options, sort_keys=True).encode()).hexdigest()[:8]
    path = Path(cache_dir).expanduser() / f"demo_stdlib_py{sys.version_info.major}{sys.version_info.minor}_{key}.json"
    if path.is_file():
        blob = json.loads(path.read_text())
        as_examples = lambda rows: [Example(q, [p]) for q, p in rows]  # noqa: E731
        return DemoSplits(as_examples(blob["train"]), as_examples(blob["val"]), blob["distractors"],
                          blob["reports"])
    splits = build_demo_splits(**options)
    blob = {
        "train": [[ex.query, ex.positives[0]] for ex in splits.train],
        "val": [[ex.query, ex.positives[0]] for ex in splits.val],
        "distractors": splits.distractors,
        "reports": splits.reports,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(blob))
    tmp.replace(path)
    log.info("demo data cached at %s", path)
    return splits
