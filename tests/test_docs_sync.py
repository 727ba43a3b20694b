"""README.md and docs/index.md cannot drift: their shared blocks (the intro, the two commands, the status box,
install, the first run, the recipes) are written once in README.md and copied by ``scripts/sync_docs.py``. Text
only: no training stack is imported."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

_spec = importlib.util.spec_from_file_location("sync_docs", REPO / "scripts" / "sync_docs.py")
sync_docs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(sync_docs)

SHARED = ["intro", "commands", "status", "install", "first-run", "recipes"]


def test_docs_index_holds_the_readme_blocks():
    readme, index = sync_docs.README.read_text(), sync_docs.INDEX.read_text()
    assert list(sync_docs.blocks(readme)) == SHARED
    problems = sync_docs.problems(readme, index)
    assert not problems, "; ".join(problems) + " (edit README.md, then run `python scripts/sync_docs.py`)"


def test_the_status_box_is_on_the_first_screen():
    readme = sync_docs.README.read_text()
    before = readme[:readme.index("<!-- /shared: status -->")]
    assert len(before.splitlines()) <= 50
    status = sync_docs.blocks(readme)["status"]
    assert re.search(r"Status \(\d{4}-\d{2}-\d{2}\)", status)
    for said in ("Verified on CPUs", "Never run on a GPU"):
        assert said in status


def test_the_two_commands_are_on_the_first_screen():
    # issue 42: they had slid to lines 64-65, under the intro, the status box and the install
    lines = sync_docs.README.read_text().splitlines()
    assert max(i for i, line in enumerate(lines, 1) if line.lstrip().startswith(("make train ", "make test "))) <= 40


def test_the_figures_that_drifted_are_stated_once():
    # the suite's time and the default run's figures live in the shared blocks only, not in index-only prose
    readme, index = sync_docs.README.read_text(), sync_docs.INDEX.read_text()
    index_only = sync_docs.BLOCK.sub("", index)
    readme_only = sync_docs.BLOCK.sub("", readme)
    for text in (index_only, readme_only):
        assert not re.search(r"min on 2 CPU cores", text)
        assert "pairs per second" not in text


def test_drift_is_found_and_repaired():
    readme, index = sync_docs.README.read_text(), sync_docs.INDEX.read_text()
    drifted = re.sub(r"~[\d.]+ min on 2 CPU cores", "10-20 min on 2 CPU cores", index, count=1)  # whatever it says
    assert drifted != index
    assert sync_docs.problems(readme, drifted) == ["block 'commands' differs between README.md and docs/index.md"]
    assert sync_docs.synced(readme, drifted) == index
    missing = sync_docs.BLOCK.sub(lambda m: "" if m.group("name") == "status" else m.group(0), index)
    assert "docs/index.md lacks the block 'status'" in sync_docs.problems(readme, missing)


def test_links_are_rewritten_for_the_site():
    body = "see [Data](docs/data.md#formats) and [Hydra](https://hydra.cc) and [x](#local)\n"
    assert sync_docs.for_docs(body) == "see [Data](data.md#formats) and [Hydra](https://hydra.cc) and [x](#local)\n"
    assert sync_docs.outside_links("[log](CHANGELOG.md) [d](docs/x.md) [w](https://w)") == ["CHANGELOG.md"]


def test_a_block_named_twice_is_refused():
    text = "<!-- shared: a -->\nx\n<!-- /shared: a -->\n<!-- shared: a -->\ny\n<!-- /shared: a -->\n"
    with pytest.raises(ValueError, match="twice"):
        sync_docs.blocks(text)
