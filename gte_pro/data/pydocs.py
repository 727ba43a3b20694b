"""An offline retrieval set whose documents are confusable: the API docs of installed third-party packages.

Query: the one-line summary of a public function or method ("Return the indices of the maximum values along an
axis."). Document: its qualified name and signature, then the rest of its docstring (parameters, returns, notes).
Near-duplicates abound (argmax/argmin/nanargmax, numpy's and torch's twins, a dozen optimizers' ``step``), so
telling the right document from a look-alike is the task, which is what hard negatives are meant to teach.

Sources are parsed with ``ast`` (``gte_pro.data.docstrings``), never imported. The output is deterministic for a
given set of installed packages and ``seed``::

    python -m gte_pro.data.pydocs --out data/pydocs --max-train 2000 --max-test 500
    python train.py data=jsonl data.train_file=data/pydocs/train.jsonl eval.beir=[data/pydocs/beir]

writes ``train.jsonl`` ({"query", "positive"} lines, for ``data=jsonl``) and ``beir/`` (``corpus.jsonl``,
``queries.jsonl``, ``qrels/test.tsv``): held-out queries, disjoint from the training ones, searched over every
document of the set (the training positives included, as distractors).
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import importlib.util
import json
import logging
import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from gte_pro.data.docstrings import docstring_pair, parsed_sources
from gte_pro.utils.files import write_atomic, write_text_atomic

log = logging.getLogger(__name__)

PACKAGES = ("numpy", "scipy", "torch", "pandas", "sklearn", "networkx", "sympy", "matplotlib", "transformers")
# test suites repeat the API's docstrings; vendored copies are another package's docs; transformers' models/ holds
# one near-identical docstring per architecture ("The bare X Model outputting raw hidden-states ...") by the thousand
_SKIP_PARTS = frozenset({"tests", "test", "testing", "conftest.py", "_vendor", "vendored", "externals",
                         "__pycache__", "models"})
# a summary that is really a signature ("tanh(input) -> Tensor"): the next paragraph is the summary
_SIGNATURE = re.compile(r"^[\w.]+\(.*\)\s*(->.*)?$")
# RST directives, doctest lines, section headings ("Parameters ==========") and pointers are no summaries
_NOT_A_SUMMARY = re.compile(r"^(\.\.|>>>|:|alias|see |deprecated)|={3,}|-{3,}", re.IGNORECASE)
MIN_QUERY_CHARS, MAX_QUERY_CHARS, MIN_BODY_CHARS = 15, 300, 40
MAX_SIGNATURE_CHARS, MAX_DOC_CHARS = 200, 2000


@dataclass(frozen=True)
class ApiDoc:
    package: str
    name: str  # qualified: module path, classes, function
    query: str  # the docstring's summary
    title: str  # name(signature)
    text: str  # the rest of the docstring

    @property
    def document(self) -> str:
        # what the BEIR reader makes of {"title", "text"}: the training positive must be the same string
        return f"{self.title} {self.text}"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, is_method: bool) -> str:
    args = copy.copy(node.args)
    static = any(ast.unparse(d) == "staticmethod" for d in node.decorator_list)
    if is_method and not static:  # self / cls: the same in every method, no information
        if args.posonlyargs:
            args.posonlyargs = args.posonlyargs[1:]
        else:
            args.args = args.args[1:]
    text = ast.unparse(args)
    return text if len(text) <= MAX_SIGNATURE_CHARS else text[:MAX_SIGNATURE_CHARS] + " ..."


def _summary_and_body(doc: str) -> tuple[str, str] | None:
    """(one-line summary, body) of a docstring, or None when it has no usable summary or too little body."""
    pair = docstring_pair(doc)
    if pair and _SIGNATURE.match(_one_line(pair[0])):
        pair = docstring_pair(pair[1])
    if not pair:
        return None
    summary, body = _one_line(pair[0]), _one_line(pair[1])
    if (_NOT_A_SUMMARY.search(summary) or len(summary.split()) < 3 or len(body) < MIN_BODY_CHARS
            or not MIN_QUERY_CHARS <= len(summary) <= MAX_QUERY_CHARS):
        return None
    return summary, body[:MAX_DOC_CHARS]


def _documented(body: Sequence[ast.stmt], prefix: str,
                in_class: bool = False) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef, bool]]:
    """(qualified name, node, is a method) of every public function and method under ``body`` (classes
    recursively)."""
    for node in body:
        if getattr(node, "name", "_").startswith("_"):
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield f"{prefix}.{node.name}", node, in_class
        elif isinstance(node, ast.ClassDef):
            yield from _documented(node.body, f"{prefix}.{node.name}", in_class=True)


def api_docs(package: str, root: Path) -> list[ApiDoc]:
    """The documented public functions and methods of the package whose source folder is ``root``."""
    docs = []
    for path, tree in parsed_sources(root, _SKIP_PARTS):
        module = ".".join((package, *path.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for name, node, is_method in _documented(tree.body, module):
            doc = ast.get_docstring(node, clean=True)
            parts = _summary_and_body(doc) if doc else None
            if parts:
                docs.append(ApiDoc(package, name, parts[0], f"{name}({_signature(node, is_method)})", parts[1]))
    return docs


def package_root(package: str) -> Path | None:
    """The source folder of an installed package, found without importing it (None when it is not installed)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


@dataclass
class PydocsSplits:
    train: list[ApiDoc]
    test: list[ApiDoc]
    distractors: list[ApiDoc]  # documents without a query: ambiguous summaries, and pairs beyond the caps
    counts: dict[str, Counter]


def _unambiguous(docs: list[ApiDoc]) -> tuple[list[ApiDoc], list[ApiDoc]]:
    """(pairs, distractors): one pair per distinct document; a summary shared by several documents ("Perform a
    single optimization step." of a dozen optimizers) has no single right answer, so its documents only serve
    as (hard) distractors."""
    seen: set[str] = set()
    unique = [d for d in docs if not (d.document in seen or seen.add(d.document))]
    counts = Counter(d.query for d in unique)
    return [d for d in unique if counts[d.query] == 1], [d for d in unique if counts[d.query] > 1]


def split_pydocs(docs: list[ApiDoc], max_train: int, max_test: int, seed: int, max_package_share: float = 0.2,
                 max_distractors: int = 2000) -> PydocsSplits:
    """Test and training pairs (disjoint queries) with at most ``max_package_share`` of the pairs wanted from any
    one package, and the distractors: every choice is a ``random.Random(seed)`` draw over a sorted list."""
    rng = random.Random(seed)
    pairs, distractors = _unambiguous(docs)
    cap = max(1, math.ceil((max_train + max_test) * max_package_share))
    by_package: dict[str, list[ApiDoc]] = defaultdict(list)
    for doc in pairs:
        by_package[doc.package].append(doc)
    pool, left = [], []
    for package in sorted(by_package):
        items = by_package[package]
        rng.shuffle(items)
        pool += items[:cap]
        left += items[cap:]
    rng.shuffle(pool)
    test, train = pool[:max_test], pool[max_test:max_test + max_train]
    spare = distractors + pool[max_test + max_train:] + left
    rng.shuffle(spare)
    counts = {name: Counter(d.package for d in split) for name, split in (("train", train), ("test", test))}
    return PydocsSplits(train, test, spare[:max_distractors], counts)


def _doc_id(doc: ApiDoc) -> str:
    return "d" + hashlib.sha1(doc.document.encode("utf-8")).hexdigest()[:16]


def _write_beir(folder: Path, splits: PydocsSplits) -> None:
    corpus = sorted(splits.train + splits.test + splits.distractors, key=_doc_id)
    (folder / "qrels").mkdir(parents=True)
    lines = [json.dumps({"_id": _doc_id(d), "title": d.title, "text": d.text}) for d in corpus]
    (folder / "corpus.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    ids = [f"q{i:05d}" for i in range(len(splits.test))]
    lines = [json.dumps({"_id": qid, "text": d.query}) for qid, d in zip(ids, splits.test, strict=True)]
    (folder / "queries.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    qrels = ["query-id\tcorpus-id\tscore"] + [f"{qid}\t{_doc_id(d)}\t1" for qid, d in zip(ids, splits.test,
                                                                                         strict=True)]
    (folder / "qrels" / "test.tsv").write_text("\n".join(qrels) + "\n", encoding="utf-8")


def build_pydocs(out_dir: str | Path, max_train: int = 2000, max_test: int = 500, seed: int = 0,
                 packages: Sequence[str] = PACKAGES, roots: dict[str, Path] | None = None,
                 max_distractors: int = 2000, max_package_share: float = 0.2) -> dict[str, Path]:
    """Write ``train.jsonl`` and ``beir/`` under ``out_dir`` (each atomically); their paths.

    ``roots`` maps a package to its source folder (default: where it is installed; packages not installed are
    skipped, and named in the log). No package gives more than ``max_package_share`` of max_train + max_test
    pairs, so with few packages the set is smaller than asked (the sizes are printed)."""
    if max_train < 1 or max_test < 1:
        raise ValueError(f"max_train and max_test must be >= 1, got {max_train} and {max_test}")
    if not 0 < max_package_share <= 1:
        raise ValueError(f"max_package_share must be in (0, 1], got {max_package_share}")
    docs = []
    for package in packages:
        root = (roots or {}).get(package) or package_root(package)
        if root is None:
            log.warning("pydocs: %s is not installed, skipped", package)
            continue
        docs += api_docs(package, root)
    splits = split_pydocs(docs, max_train, max_test, seed, max_package_share, max_distractors)
    if not splits.train or not splits.test:
        raise ValueError(f"pydocs: {len(docs)} documented functions in {', '.join(packages)} make no train/test split")
    out = Path(out_dir).expanduser()
    train = "".join(json.dumps({"query": d.query, "positive": d.document}) + "\n" for d in splits.train)
    paths = {"train": write_text_atomic(out / "train.jsonl", train),
             "beir": write_atomic(out / "beir", lambda tmp: _write_beir(tmp, splits))}
    _report(splits)
    return paths


def _report(splits: PydocsSplits) -> None:
    corpus = len(splits.train) + len(splits.test) + len(splits.distractors)
    print(f"pydocs: {len(splits.train)} training pairs, {len(splits.test)} test queries, {corpus} documents "
          f"({len(splits.distractors)} without a query)")
    for name, counts in splits.counts.items():
        print(f"  {name}: " + ", ".join(f"{package} {n}" for package, n in sorted(counts.items())))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="folder for train.jsonl and beir/")
    parser.add_argument("--max-train", type=int, default=2000)
    parser.add_argument("--max-test", type=int, default=500)
    parser.add_argument("--max-distractors", type=int, default=2000, help="documents without a query, at most")
    parser.add_argument("--max-package-share", type=float, default=0.2, help="of the pairs, per package")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--packages", default=",".join(PACKAGES), help="comma-separated, parsed in this order")
    args = parser.parse_args(argv)
    paths = build_pydocs(args.out, args.max_train, args.max_test, args.seed, args.packages.split(","),
                         max_distractors=args.max_distractors, max_package_share=args.max_package_share)
    for name, path in paths.items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    main()
