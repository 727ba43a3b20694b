"""The pydocs retrieval set (gte_pro.data.pydocs): what it parses, and that its files load through the project's
readers, keep test queries out of training, and come out the same on every build."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gte_pro.data.beir import load_beir
from gte_pro.data.pydocs import api_docs, build_pydocs
from gte_pro.data.records import iter_pairs_jsonl

TOPICS = ["maximum", "minimum", "median", "variance", "cumulative sum", "product", "sorted copy", "unique values",
          "rank", "histogram", "gradient", "difference", "absolute value", "logarithm", "square root", "mean"]


def _function(name: str, summary: str, extra: str = "") -> str:
    return (f'def {name}(values, axis=None{extra}):\n    """{summary}\n\n    Parameters\n    ----------\n'
            f'    values : array\n        The input values whose {name} is computed along ``axis``.\n    """\n\n\n')


def _fake_package(root: Path, package: str) -> Path:
    """A package folder with public functions and methods, plus what must be left out."""
    folder = root / package
    (folder / "tests").mkdir(parents=True)
    body = "".join(_function(f"{package}_{i}", f"Return the {topic} of the values ({package}).")
                   for i, topic in enumerate(TOPICS))
    body += _function("shared_a", "Perform a single optimization step.") + _function(
        "shared_b", "Perform a single optimization step.", ", lr=0.1")  # one summary, two documents: ambiguous
    body += _function("_private", "A private helper that is not part of the API.")
    body += ('def tanh(x):\n    """tanh(input) -> Tensor\n\n    Applies the hyperbolic tangent element-wise to x.'
             '\n\n    Returns the tangent of every element, in the input dtype.\n    """\n\n\n')
    body += ('class Scaler:\n    def fit(self, values, copy=True):\n        """Learn the scale of the values for '
             'later use.\n\n        Stores the standard deviation of every column in ``self.scale_``.\n'
             '        """\n')
    (folder / "__init__.py").write_text("")
    (folder / "core.py").write_text(body)
    (folder / "tests" / "test_core.py").write_text(_function("test_it", "A test that is not the package's API."))
    return folder


@pytest.fixture(scope="module")
def roots(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("site")
    return {name: _fake_package(root, name) for name in ("alpha", "beta")}


def _build(out: Path, roots: dict[str, Path], seed: int = 0) -> dict[str, Path]:
    return build_pydocs(out, max_train=20, max_test=8, seed=seed, packages=("alpha", "beta"), roots=roots,
                        max_distractors=3, max_package_share=0.6)


def test_the_set_loads_through_the_readers_with_disjoint_test_queries(tmp_path, roots):
    paths = _build(tmp_path / "set", roots)
    train = list(iter_pairs_jsonl(paths["train"]))  # what data=jsonl reads
    beir = load_beir(paths["beir"], "test")  # what eval.beir reads
    assert len(train) == 20 and len(beir.queries) == 8
    assert not {ex.query for ex in train} & set(beir.queries)
    # qrels name existing documents, one each; every training positive is in the corpus as a distractor
    qrels = (paths["beir"] / "qrels" / "test.tsv").read_text().splitlines()[1:]
    corpus_ids = set(beir.corpus_ids)
    assert len(qrels) == 8 and all(line.split("\t")[1] in corpus_ids for line in qrels)
    assert all(len(relevant) == 1 for relevant in beir.relevant)
    assert {p for ex in train for p in ex.positives} <= set(beir.corpus)
    assert len(beir.corpus) == 20 + 8 + 3
    # the cap: 0.6 of 28 pairs is at most 17 from one package
    assert max(sum(p.startswith(f"{package}.") for p in beir.corpus) for package in ("alpha", "beta")) <= 17 + 3


def test_what_is_parsed(roots):
    docs = {d.name: d for d in api_docs("alpha", roots["alpha"])}
    # public functions and methods of the package; no private names, no test suites
    assert set(docs) == {f"alpha.core.alpha_{i}" for i in range(len(TOPICS))} | {
        "alpha.core.shared_a", "alpha.core.shared_b", "alpha.core.tanh", "alpha.core.Scaler.fit"}
    # a signature line is no summary: the paragraph after it is
    assert docs["alpha.core.tanh"].query == "Applies the hyperbolic tangent element-wise to x."
    # the document: qualified name, signature without self, the rest of the docstring on one line
    fit = docs["alpha.core.Scaler.fit"]
    assert fit.query == "Learn the scale of the values for later use."
    assert fit.document == "alpha.core.Scaler.fit(values, copy=True) Stores the standard deviation of every column " \
                           "in ``self.scale_``."
    assert docs["alpha.core.alpha_0"].document.startswith(
        "alpha.core.alpha_0(values, axis=None) Parameters ---------- values : array The input values")


def test_a_summary_of_several_documents_is_no_query(tmp_path, roots):
    paths = _build(tmp_path / "set", roots)
    queries = {ex.query for ex in iter_pairs_jsonl(paths["train"])} | set(load_beir(paths["beir"], "test").queries)
    assert "Perform a single optimization step." not in queries
    assert len(queries) == 28


def test_the_build_is_deterministic_and_the_seed_changes_the_split(tmp_path, roots):
    def files(paths: dict[str, Path]) -> dict[str, bytes]:
        return {str(p.relative_to(paths["train"].parent)): p.read_bytes()
                for p in sorted(paths["train"].parent.rglob("*")) if p.is_file()}

    first, again = files(_build(tmp_path / "a", roots)), files(_build(tmp_path / "b", roots))
    assert first == again and set(first) == {"train.jsonl", "beir/corpus.jsonl", "beir/queries.jsonl",
                                              "beir/qrels/test.tsv"}
    other = files(_build(tmp_path / "c", roots, seed=1))
    assert other["beir/queries.jsonl"] != first["beir/queries.jsonl"]


def test_installed_numpy_parses_into_pairs(tmp_path):
    """The real thing, without importing it: numpy's own sources."""
    pytest.importorskip("numpy")
    paths = build_pydocs(tmp_path / "np", max_train=40, max_test=10, packages=("numpy",), max_distractors=10,
                         max_package_share=1.0)
    rows = [json.loads(line) for line in paths["train"].read_text().splitlines()]
    assert len(rows) == 40 and all(r["positive"].startswith("numpy.") for r in rows)
    assert len(load_beir(paths["beir"], "test").queries) == 10


@pytest.mark.parametrize("kwargs,message", [({"max_train": 0}, "max_train and max_test must be >= 1"),
                                            ({"max_package_share": 0}, r"max_package_share must be in \(0, 1\]")])
def test_bad_sizes_are_named(tmp_path, roots, kwargs, message):
    with pytest.raises(ValueError, match=message):
        build_pydocs(tmp_path, **{"max_train": 5, "max_test": 5, "roots": roots, "packages": ("alpha",), **kwargs})
