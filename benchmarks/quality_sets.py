"""The retrieval sets of ``bench_quality.py``, each a folder ``train.jsonl`` ({"query", "positive"} lines, for
``data=jsonl``) + ``beir/`` (``corpus.jsonl``, ``queries.jsonl``, ``qrels/test.tsv``), built offline and
deterministically on first use:

- ``pydocs``: ``gte_pro.data.pydocs``: the one-line summary of a documented public function or method of an
  installed third-party package (numpy, scipy, torch, ...) -> its qualified name, signature and the rest of its
  docstring (natural language -> API documentation);
- ``stdcode``: the one-line summary of a documented function or method of the Python standard library -> its
  source code without the docstring (``ast.unparse``: ``def name(args): body``; natural language -> code, as in
  CodeSearchNet). Another kind of pair (code, not prose) from another source (the stdlib, not third-party packages);
  the demo corpus's own held-out split (summary -> docstring body, the stdlib again) has 266 queries over 1,266
  documents, too small for a benchmark that must tell variants apart.

Both hold out test queries disjoint from the training ones and search them over every document of the set (training
positives included, as distractors, plus documents that have no query).
"""

from __future__ import annotations

import ast
import copy
import hashlib
import json
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from gte_pro.data.docstrings import docstring_pair, parsed_sources
from gte_pro.utils.files import write_atomic, write_text_atomic

SETS = ("pydocs", "stdcode")
# test suites and demos repeat the library's own code; site-packages is not the stdlib (as data=demo skips)
_SKIP_PARTS = frozenset({"test", "tests", "idlelib", "lib2to3", "turtledemo", "site-packages", "ensurepip",
                         "__pycache__"})
MIN_QUERY_CHARS, MAX_QUERY_CHARS, MIN_CODE_CHARS, MAX_CODE_CHARS = 15, 300, 80, 2000
# data=jsonl needs a validation split: a run holds out this share of train.jsonl (a hash of the query)
VAL_FRACTION = 0.05


@dataclass(frozen=True)
class CodePair:
    query: str  # the docstring's summary, on one line ("" for code without a usable docstring: a distractor)
    code: str  # the function's source without its docstring


def _without_docstring(node: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    node = copy.deepcopy(node)
    body = node.body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    if not body:
        return None
    node.body = body
    try:
        code = ast.unparse(node)
    except (ValueError, RecursionError):  # a tree ast cannot print back
        return None
    return code if len(code) >= MIN_CODE_CHARS else None


def _summary(doc: str) -> str | None:
    pair = docstring_pair(doc)
    summary = " ".join((pair[0] if pair else doc).split())
    if len(summary.split()) < 3 or not MIN_QUERY_CHARS <= len(summary) <= MAX_QUERY_CHARS:
        return None
    if summary.startswith((">>>", "..", ":")):
        return None
    return summary


def stdlib_code(root: Path | None = None) -> list[CodePair]:
    """Every function and method of the standard library with its code (``query`` "" where it has no usable
    docstring summary), in a deterministic order."""
    root = Path(root or sysconfig.get_paths()["stdlib"])
    pairs = []
    for _, tree in parsed_sources(root, _SKIP_PARTS):
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            code = _without_docstring(node)
            if code is None:
                continue
            doc = ast.get_docstring(node, clean=True)
            pairs.append(CodePair((doc and _summary(doc)) or "", code[:MAX_CODE_CHARS]))
    return pairs


@dataclass
class Split:
    train: list[CodePair]
    test: list[CodePair]
    distractors: list[CodePair]


def split_code(pairs: list[CodePair], max_train: int, max_test: int, seed: int, max_distractors: int) -> Split:
    """One pair per distinct code; a summary shared by several functions has no single answer: its code, and code
    without a docstring, only serve as distractors. Every choice is a ``random.Random(seed)`` draw."""
    seen: set[str] = set()
    unique = [p for p in pairs if not (p.code in seen or seen.add(p.code))]
    counts: dict[str, int] = {}
    for p in unique:
        counts[p.query] = counts.get(p.query, 0) + 1
    usable = [p for p in unique if p.query and counts[p.query] == 1]
    spare = [p for p in unique if not p.query or counts[p.query] > 1]
    rng = random.Random(seed)
    rng.shuffle(usable)
    test, train = usable[:max_test], usable[max_test:max_test + max_train]
    spare += usable[max_test + max_train:]
    rng.shuffle(spare)
    return Split(train, test, spare[:max_distractors])


def _doc_id(text: str) -> str:
    return "d" + hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def _write_beir(folder: Path, split: Split) -> None:
    corpus = sorted({p.code for p in split.train + split.test + split.distractors}, key=_doc_id)
    (folder / "qrels").mkdir(parents=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": _doc_id(c), "title": "", "text": c}) + "\n"
                                                 for c in corpus), encoding="utf-8")
    ids = [f"q{i:05d}" for i in range(len(split.test))]
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": q, "text": p.query}) + "\n"
                                                  for q, p in zip(ids, split.test, strict=True)), encoding="utf-8")
    qrels = "".join(f"{q}\t{_doc_id(p.code)}\t1\n" for q, p in zip(ids, split.test, strict=True))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + qrels, encoding="utf-8")


def build_stdcode(out_dir: str | Path, max_train: int = 2000, max_test: int = 500, seed: int = 0,
                  max_distractors: int = 2000, root: Path | None = None) -> dict[str, int]:
    """Write ``train.jsonl`` and ``beir/`` under ``out_dir`` (each atomically); the set's sizes."""
    split = split_code(stdlib_code(root), max_train, max_test, seed, max_distractors)
    if not split.train or not split.test:
        raise ValueError("stdcode: too few documented functions for a train/test split")
    out = Path(out_dir).expanduser()
    write_text_atomic(out / "train.jsonl", "".join(json.dumps({"query": p.query, "positive": p.code}) + "\n"
                                                   for p in split.train))
    write_atomic(out / "beir", lambda tmp: _write_beir(tmp, split))
    return sizes(out)


def sizes(folder: Path, val_fraction: float = VAL_FRACTION) -> dict[str, int]:
    """Pairs in train.jsonl, those a run trains on (the rest: its held-out split, ``data.val_fraction``), test
    queries and documents of a set folder."""
    from gte_pro.data.split import is_held_out

    def lines(path: Path) -> list[str]:
        return [line for line in path.open(encoding="utf-8") if line.strip()]

    pairs = lines(folder / "train.jsonl")
    held = sum(is_held_out(" ".join(json.loads(line)["query"].split()), val_fraction) for line in pairs)
    return {"pairs": len(pairs), "train_pairs": len(pairs) - held, "test_queries": len(lines(folder / "beir" /
            "queries.jsonl")), "documents": len(lines(folder / "beir" / "corpus.jsonl"))}


def build_set(name: str, workdir: Path, max_train: int, max_test: int, dry_run: bool = False) -> Path:
    """The folder of set ``name`` under ``workdir`` (built on first use; not with ``dry_run``)."""
    folder = workdir / f"{name}_{max_train}_{max_test}"
    if dry_run or (folder / "train.jsonl").is_file() and (folder / "beir" / "qrels" / "test.tsv").is_file():
        return folder
    if name == "pydocs":
        from gte_pro.data.pydocs import build_pydocs

        build_pydocs(folder, max_train, max_test, seed=0)
    elif name == "stdcode":
        build_stdcode(folder, max_train, max_test, seed=0)
    else:
        raise ValueError(f"unknown set {name!r}; valid: {', '.join(SETS)}")
    return folder
