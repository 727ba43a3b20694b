"""docs/configuration.md's option tables, made from the schemas (gte_pro/config/schema/): every key of every group
with its default, what it accepts and its one-line meaning, so the manual cannot drift from what the code checks.

    python -m gte_pro.config.tables            # rewrite the generated part of docs/configuration.md
    python -m gte_pro.config.tables --check    # exit 1 when it differs from the schemas (tests/test_config_schema.py)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import MISSING, Field
from pathlib import Path
from typing import Any

from gte_pro.config.checks import schema_fields
from gte_pro.config.schema import SCHEMAS
from gte_pro.config.schema.data import DataCommon
from gte_pro.config.schema.run import RunSchema, TrainerSchema

PAGE = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN, END = "<!-- generated: option tables (python -m gte_pro.config.tables) -->", "<!-- /generated -->"


def _default(item: Field) -> str:
    value: Any = item.default if item.default is not MISSING else item.default_factory()
    if value == "???":
        return "required"
    if isinstance(value, str) and value.startswith("${"):
        return f"`{value}`"
    if hasattr(value, "__dataclass_fields__"):
        return "(see below)"
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else repr(value) if (
        isinstance(value, str)) else str(value)
    return f"`{text}`"


def _table(schema: type, prefix: str, inherited: type | None = None) -> list[str]:
    """One markdown table of ``schema``'s keys; ``inherited``: leave out the keys it states with the same default."""
    same = {key: item for key, item in schema_fields(inherited)} if inherited else {}
    rows = ["| key | default | accepts | meaning |", "|---|---|---|---|"]
    for key, item in schema_fields(schema):
        if key in same and _default(same[key]) == _default(item):
            continue
        rule = item.metadata.get("rule")
        accepts = rule.text if rule is not None else "(its type)"
        # a table cell: a pipe would end it, and <run dir> would be read as an HTML tag
        meaning = item.metadata["doc"].replace("|", "\\|").replace("<", "&lt;")
        rows.append(f"| `{prefix}{key}` | {_default(item)} | {accepts.replace('|', '/')} | {meaning} |")
    return rows if len(rows) > 2 else []


def _section(title: str, intro: str, tables: list[list[str]]) -> list[str]:
    lines = [f"### {title}", "", intro, ""]
    for table in tables:
        if table:
            lines += [*table, ""]
    return lines


def option_tables() -> str:
    """The generated part of docs/configuration.md."""
    lines = [BEGIN, "", "## Every option", "",
             "Made from the schemas in `gte_pro/config/schema/` (`python -m gte_pro.config.tables`): the one place a "
             "key's default, range and meaning are stated. `accepts` is what `check_config` lets through before "
             "anything is built.", ""]
    lines += _section("Top level (conf/train.yaml)", "`RunSchema` in `gte_pro/config/schema/run.py`.",
                      [_table(RunSchema, "")])
    lines += _section("trainer/", "`TrainerSchema`: the keys gte-pro checks; any other Lightning `Trainer` argument "
                      "passes through.", [_table(TrainerSchema, "trainer.")])
    lines += _section("data/", "Every source shares the first table (`DataCommon`); each option adds or changes the "
                      "keys of its own table.", [_table(DataCommon, "data.")])
    for option, schema in SCHEMAS["data"].items():
        lines += [f"`data={option}` ({schema.__name__}):", "", *_table(schema, "data.", DataCommon), ""]
    for group in ("model", "loss"):
        first = None
        for option, schema in SCHEMAS[group].items():
            lines += [f"### {group}/{option}" if first is None else f"`{group}={option}` ({schema.__name__}, keys "
                      f"that differ from or add to `{group}/{first}`'s where it extends it):", ""]
            base = next((b for b in schema.__mro__[1:] if b in SCHEMAS[group].values()), None)
            lines += [*_table(schema, f"{group}.", base), ""]
            first = first or option
    for group in ("eval", "mine", "score", "merge", "sweep", "export"):
        schema = SCHEMAS[group]["default"]
        lines += _section(f"{group}/", f"`{schema.__name__}`.", [_table(schema, f"{group}.")])
    lines.append(END)
    return "\n".join(lines) + "\n"


def page_with_tables(page: str) -> str:
    """``page`` with its generated part replaced (appended when it has none)."""
    if BEGIN in page:
        head, rest = page.split(BEGIN, 1)
        return head + option_tables() + rest.split(END, 1)[1].lstrip("\n")
    return page.rstrip("\n") + "\n\n" + option_tables()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="report drift, change nothing")
    args = parser.parse_args(argv)
    current = PAGE.read_text()
    wanted = page_with_tables(current)
    if args.check:
        if current != wanted:
            print(f"{PAGE}: the option tables differ from the schemas; run python -m gte_pro.config.tables",
                  file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(wanted)
    return 0


if __name__ == "__main__":
    sys.exit(main())
