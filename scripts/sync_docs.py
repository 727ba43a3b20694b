"""README.md and docs/index.md share their first screen: blocks between ``<!-- shared: NAME -->`` and
``<!-- /shared: NAME -->`` are written in README.md and copied into docs/index.md, links rewritten for the docs site
(``docs/x.md`` -> ``x.md``).

    python scripts/sync_docs.py           # copy README.md's shared blocks into docs/index.md
    python scripts/sync_docs.py --check   # exit 1, naming the blocks, when docs/index.md has drifted

``tests/test_docs_sync.py`` runs the check, so an edit of one file without the other fails the suite. Standard library
only: the test imports this file without the training stack.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
INDEX = REPO / "docs" / "index.md"

BLOCK = re.compile(r"<!-- shared: (?P<name>[\w-]+) -->\n(?P<body>.*?)<!-- /shared: (?P=name) -->", re.S)
# a Markdown link target into docs/ (README's view) -> the same page from docs/index.md
DOCS_LINK = re.compile(r"\]\(docs/")


def blocks(text: str) -> dict[str, str]:
    """NAME -> body of every shared block, in order; a name used twice is an error."""
    found: dict[str, str] = {}
    for match in BLOCK.finditer(text):
        name = match.group("name")
        if name in found:
            raise ValueError(f"shared block {name!r} appears twice")
        found[name] = match.group("body")
    return found


def for_docs(body: str) -> str:
    """A README block as docs/index.md holds it: links into docs/ made relative to docs/."""
    return DOCS_LINK.sub("](", body)


def outside_links(body: str) -> list[str]:
    """Relative link targets of a README block that the docs site cannot reach (outside docs/)."""
    targets = re.findall(r"\]\(([^)#\s]+)", body)
    return [t for t in targets if "://" not in t and not t.startswith(("docs/", "#", "mailto:"))]


def problems(readme: str, index: str) -> list[str]:
    """What differs between README's shared blocks and docs/index.md's; empty when they agree."""
    ours, theirs = blocks(readme), blocks(index)
    found = [f"README.md has no block {name!r} of docs/index.md" for name in theirs if name not in ours]
    for name, body in ours.items():
        if outside_links(body):
            found.append(f"block {name!r} links outside docs/ (the site cannot): {', '.join(outside_links(body))}")
        if name not in theirs:
            found.append(f"docs/index.md lacks the block {name!r}")
        elif theirs[name] != for_docs(body):
            found.append(f"block {name!r} differs between README.md and docs/index.md")
    if list(ours) != [n for n in theirs if n in ours]:
        found.append(f"the blocks are in another order: README {list(ours)}, docs/index.md {list(theirs)}")
    return found


def synced(readme: str, index: str) -> str:
    """docs/index.md with each shared block replaced by README's (blocks README lacks are left as they are)."""
    ours = blocks(readme)

    def replace(match: re.Match[str]) -> str:
        name = match.group("name")
        body = for_docs(ours[name]) if name in ours else match.group("body")
        return f"<!-- shared: {name} -->\n{body}<!-- /shared: {name} -->"

    return BLOCK.sub(replace, index)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    readme, index = README.read_text(), INDEX.read_text()
    if args.check:
        found = problems(readme, index)
        for problem in found:
            print(f"docs drift: {problem}", file=sys.stderr)
        if found:
            print("  fix: edit README.md, then run `python scripts/sync_docs.py`", file=sys.stderr)
        return 1 if found else 0
    new = synced(readme, index)
    missing = [name for name in blocks(readme) if name not in blocks(new)]
    if missing:
        print(f"docs/index.md has no place for the block(s) {', '.join(missing)}: add "
              f"'<!-- shared: NAME -->' / '<!-- /shared: NAME -->' lines there first", file=sys.stderr)
        return 1
    if new != index:
        INDEX.write_text(new)
        print("docs/index.md updated from README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
