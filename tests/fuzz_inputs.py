"""The malformed inputs of tests/test_fuzz.py, generated deterministically (fixed seeds, no clock).

Each ``Case`` writes one input under a folder and says what a clear error about it must name: the file (always),
``where`` (the line or row, e.g. ``line 5``) and ``field`` (e.g. ``'query'``), or for the command line the key and
a valid choice. ``valid`` marks legal variants of a format (a BOM, CRLF line ends): those must read exactly like
the plain input. Data cases come from here; command-line cases from ``tests/fuzz_cli.py``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.beir_data import write_beir_folder

BOM = b"\xef\xbb\xbf"
TEN_MB = 10 * 1024 * 1024
BAD_LINE = 5  # the line (1-based) of a JSON-lines file that holds the defect


@dataclass
class Case:
    name: str
    kind: str  # jsonl | hf | beir | beir_train | cli | launcher
    make: Callable[[Path], dict[str, Any]]  # writes the input; returns what the runner needs (and "file")
    where: str | None = None  # e.g. "line 5" / "row 4": what an error must name besides the file
    field: str | None = None  # e.g. "'query'" or a config key
    valid: bool = False  # a legal variant: read exactly like the clean input
    env: dict[str, str] | None = None  # environment variables set while it runs (a scheduler's)


# --- JSON lines -------------------------------------------------------------------------------------------------
def good_rows(n: int = 24) -> list[dict[str, Any]]:
    return [{"query": f"what is topic {i} about", "positive": f"Topic {i} covers subject {i} in depth, with examples.",
             "negatives": [f"An unrelated passage number {i} about the weather in city {i}."]} for i in range(n)]


def _line(row: Any) -> bytes:
    return row if isinstance(row, bytes) else json.dumps(row).encode()


def _lines_file(lines: list[bytes], newline: bytes = b"\n", bom: bool = False) -> bytes:
    return (BOM if bom else b"") + newline.join(lines) + newline


def clean_jsonl() -> bytes:
    """The good rows as a plain file: what every legal variant must read like."""
    return _lines_file([_line(r) for r in good_rows()])


def _with_defect(defect: bytes | list[bytes], at: int = BAD_LINE) -> list[bytes]:
    lines = [_line(r) for r in good_rows()]
    return lines[: at - 1] + (defect if isinstance(defect, list) else [defect]) + lines[at - 1 :]


def jsonl(name: str, body: bytes, where: str | None = None, field: str | None = None, valid: bool = False,
          val_body: bytes | None = None) -> Case:
    """A training file (and optionally a validation file) with the given bytes."""
    def make(folder: Path) -> dict[str, Any]:
        train = folder / "train.jsonl"
        train.write_bytes(body)
        if val_body is None:
            return {"train_file": str(train), "file": train}
        val = folder / "val.jsonl"
        val.write_bytes(val_body)
        return {"train_file": str(train), "val_file": str(val), "file": val}
    return Case(name, "jsonl", make, where, field, valid)


def bad_line(name: str, defect: bytes | dict | list, field: str | None = None) -> Case:
    """Line 5 of an otherwise good file holds ``defect``."""
    return jsonl(name, _lines_file(_with_defect(_line(defect))), f"line {BAD_LINE}", field)


def good_with(**changes: Any) -> dict[str, Any]:
    return {**good_rows()[0], "query": "a query with a defect", **changes}


def _syntax_cases() -> list[Case]:
    row = _line(good_rows()[0])
    cases = [bad_line(f"truncated JSON at byte {cut}", row[:cut]) for cut in (1, 9, len(row) // 2, len(row) - 1)]
    rng = random.Random(10)
    for i in range(8):  # random bytes, no line breaks (so the defect stays on line 5)
        junk = bytes(b for b in rng.randbytes(24 + 16 * i) if b not in b"\r\n")
        cases.append(bad_line(f"binary bytes #{i}", junk))
    for label, raw in [("latin-1 e-acute", b"caf\xe9"), ("overlong slash", b"\xc0\xaf"), ("continuation byte", b"\x80"),
                       ("CESU surrogate", b"\xed\xa0\x80"), ("cut 3-byte sequence", b"\xe2\x82"),
                       ("0xFF byte", b"\xff"), ("UTF-16 BOM inside", b"\xff\xfe")]:
        cases.append(bad_line(f"invalid UTF-8: {label}", b'{"query": "' + raw + b'", "positive": "long enough text"}'))
    cases.append(bad_line("raw NUL byte in a string", b'{"query": "a\x00b", "positive": "long enough text"}'))
    cases.append(bad_line("raw ESC byte in a string", b'{"query": "a\x1b[31m", "positive": "long enough text"}'))
    for label, text in [("plain words", b"hello world"), ("YAML", b"query: what"), ("open array", b"[1, 2"),
                        ("closing brace", b"}"), ("two objects", row + row), ("object then junk", row + b" xyz"),
                        ("single quotes", b"{'query': 'a', 'positive': 'b'}"),
                        ("trailing comma", b'{"query": "a query", "positive": "long enough text",}'),
                        ("comment", b"// a comment"), ("unquoted keys", b'{query: "a", positive: "b"}'),
                        ("Python None", b'{"query": None, "positive": "long enough text"}'),
                        ("deep nesting", b"[" * 100_000 + b"]" * 100_000),
                        ("deeply nested value", b'{"query": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"),
                        ("5000-digit integer", b'{"query": ' + b"9" * 5000 + b', "positive": "long enough"}'),
                        ("10 MB of binary", bytes(random.Random(1).randbytes(TEN_MB)).replace(b"\n", b" ")),
                        ("10 MB unterminated string", b'{"query": "q", "positive": "' + b"a" * TEN_MB)]:
        cases.append(bad_line(f"not JSON: {label}", text))
    return cases


def _field_cases() -> list[Case]:
    cases = []
    for label, value in [("{}", {}), ("null", None), ("number", 123), ("string", "just a string"), ("true", True),
                         ("array", []), ("array of the row", [good_rows()[0]])]:
        cases.append(bad_line(f"the line is {label}", value, None if label != "{}" else "'query'"))
    cases.append(bad_line("missing query", {"positive": "long enough text"}, "'query'"))
    cases.append(bad_line("missing positive", {"query": "a query"}, "'positive'"))
    cases.append(bad_line("NaN query", b'{"query": NaN, "positive": "long enough text"}', "'query'"))
    cases.append(bad_line("Infinity query", b'{"query": Infinity, "positive": "long enough text"}', "'query'"))
    cases.append(bad_line("query twice", b'{"query": "a", "query": "b", "positive": "long enough text"}', "'query'"))
    cases.append(bad_line("positive twice", b'{"query": "a", "positive": "x", "positive": "long enough"}',
                          "'positive'"))
    cases.append(bad_line("positive and pos", good_with(pos=["another positive text"]), "'positive'"))
    cases.append(bad_line("negatives and neg", good_with(neg=["another negative text"]), "'negatives'"))
    for value, label in [(1, "number"), (1.5, "float"), (True, "boolean"), (None, "null"), (["a", "b"], "list"),
                         ({"text": "a"}, "object"), ([["nested"]], "nested list")]:
        cases.append(bad_line(f"query is a {label}", good_with(query=value), "'query'"))
    for value, label in [(1, "number"), (None, "null"), (False, "boolean"), ({"text": "long enough"}, "object"),
                         ([["nested list text"]], "nested list"), ([1], "list of numbers"),
                         (["long enough text", None], "list with a null"), ([], "empty list")]:
        cases.append(bad_line(f"positive is a {label}", good_with(positive=value), "'positive'"))
    for value, label in [(7, "number"), (None, "null"), ({"a": "b"}, "object"), ([1], "list of numbers"),
                         ([["nested negative text"]], "nested list"), ([None], "list with a null"), (True, "boolean")]:
        cases.append(bad_line(f"negatives is a {label}", good_with(negatives=value), "'negatives'"))
    cases.append(bad_line("pos is a number", {"query": "a query", "pos": 3}, "'pos'"))
    cases.append(bad_line("neg is an object", {"query": "a query", "pos": ["long enough text"], "neg": {"a": 1}},
                          "'neg'"))
    return cases


def _drop_cases() -> list[Case]:
    """Rows that parse but cannot train anything (or carry texts that cleaning must change): counted drops."""
    positive = good_rows()[0]["positive"]
    rows = [("empty query", {"query": "", "positive": positive}),
            ("whitespace query", {"query": " \t ", "positive": positive}),
            ("newline query", {"query": "\n\r\n", "positive": positive}),
            ("ideographic-space query", {"query": "\u3000\u3000", "positive": positive}),
            ("zero-width query", {"query": "\u200b\u200b\u200b", "positive": positive}),
            ("2-char query", {"query": "ab", "positive": positive}),
            ("empty positive", {"query": "a real query", "positive": ""}),
            ("whitespace positive", {"query": "a real query", "positive": "    "}),
            ("short positive", {"query": "a real query", "positive": "short"}),
            ("all positives empty", {"query": "a real query", "positive": ["", " ", "\t"]}),
            ("one empty positive of two", {"query": "a real query", "positive": ["", positive + " more"]}),
            ("empty negatives", {"query": "a real query", "positive": positive + "!", "negatives": ["", "  "]}),
            ("negative equal to positive", {"query": "a real query", "positive": positive + "?",
                                            "negatives": [positive + "?"]}),
            ("NUL escape in query", {"query": "a real\u0000 query", "positive": positive + "."}),
            ("ANSI colours in positive", {"query": "a real query", "positive": "\u001b[31m" + positive}),
            ("lone surrogate in query", {"query": "a real \ud800 query", "positive": positive + ";"}),
            ("BOM character inside a text", {"query": "\ufeffa real query", "positive": positive + ":"}),
            ("right-to-left override", {"query": "a real \u202e query", "positive": positive + "-"}),
            ("private-use characters", {"query": "a real \ue000 query", "positive": positive + "+"}),
            ("10 MB positive", {"query": "a real query", "positive": "word " * (TEN_MB // 5)}),
            ("10 MB query", {"query": "q " * (TEN_MB // 2), "positive": positive + "#"})]
    cases = [bad_line(label, row) for label, row in rows]
    lines = [_line(r) for r in good_rows()]
    cases.append(jsonl("duplicate row", _lines_file(lines[:5] + [lines[0]] + lines[5:]), "line 6"))
    spaced = json.dumps({**good_rows()[0], "query": "  what is   topic 0 about "}).encode()
    cases.append(jsonl("duplicate after cleaning", _lines_file(lines[:5] + [spaced] + lines[5:]), "line 6"))
    return cases


def _file_cases() -> list[Case]:
    lines = [_line(r) for r in good_rows()]
    empty_rows = _lines_file([_line({"query": " ", "positive": "long enough text"})] * 5)
    cases = [jsonl("empty file", b""), jsonl("whitespace-only file", b" \n\n\t\n"), jsonl("BOM only", BOM),
             jsonl("every row dropped", empty_rows, field="no training rows"),
             jsonl("UTF-16 file", "\n".join(json.dumps(r) for r in good_rows()).encode("utf-16"), "line 1"),
             jsonl("UTF-32 file", "\n".join(json.dumps(r) for r in good_rows()).encode("utf-32"), "line 1"),
             jsonl("CR-only line ends", _lines_file(lines, b"\r"), "line 1"),
             jsonl("CRLF and a truncated line 7", _lines_file(_with_defect(lines[0][:20], at=7), b"\r\n"), "line 7"),
             jsonl("BOM and a bad first line", _lines_file(_with_defect(b"{oops", at=1), bom=True), "line 1"),
             jsonl("validation file with bad JSON", _lines_file(lines), "line 3",
                   val_body=_lines_file(lines[:2] + [b"{not json"] + lines[2:])),
             jsonl("validation file empty", _lines_file(lines), val_body=b""),
             jsonl("validation file all dropped", _lines_file(lines), field="no rows left", val_body=empty_rows)]
    for label, body in [("BOM", _lines_file(lines, bom=True)), ("CRLF", _lines_file(lines, b"\r\n")),
                        ("BOM and CRLF", _lines_file(lines, b"\r\n", bom=True)),
                        ("mixed CRLF and LF", b"\r\n".join(lines[:10]) + b"\n" + b"\n".join(lines[10:])),
                        ("blank lines between rows", b"\n\n".join(lines) + b"\n"),
                        ("no final newline", b"\n".join(lines)),
                        ("trailing spaces and tabs", b"\n".join(line + b" \t " for line in lines))]:
        cases.append(jsonl(f"legal variant: {label}", body, valid=True))

    def missing(folder: Path) -> dict[str, Any]:
        return {"train_file": str(folder / "nope.jsonl"), "file": folder / "nope.jsonl"}

    def a_folder(folder: Path) -> dict[str, Any]:
        (folder / "dir.jsonl").mkdir()
        return {"train_file": str(folder / "dir.jsonl"), "file": folder / "dir.jsonl"}

    cases += [Case("file does not exist", "jsonl", missing), Case("file is a folder", "jsonl", a_folder)]
    return cases


def jsonl_cases() -> list[Case]:
    return _syntax_cases() + _field_cases() + _drop_cases() + _file_cases()


# --- Hugging Face datasets (save_to_disk folders, a local JSON folder) ------------------------------------------
BAD_ROW = 4  # the row (0-based) of a dataset that holds a one-row defect


def _columns(n: int = 24) -> dict[str, list[Any]]:
    rows = good_rows(n)
    return {key: [row[key] for row in rows] for key in ("query", "positive", "negatives")}


def _save(path: Path, change: Callable[[dict[str, list[Any]]], Any] | None, dict_splits: tuple[str, ...]) -> None:
    import datasets

    columns = _columns()
    made = change(columns) if change else None
    table = made if isinstance(made, datasets.Dataset) else datasets.Dataset.from_dict(columns)
    if dict_splits:
        datasets.DatasetDict({split: table for split in dict_splits}).save_to_disk(str(path))
    else:
        table.save_to_disk(str(path))


def hf(name: str, change: Callable[[dict[str, list[Any]]], Any] | None = None, where: str | None = None,
       field: str | None = None, clean: Callable[[dict[str, list[Any]]], Any] | None = None,
       dict_splits: tuple[str, ...] = (), names_path: bool = True, **module: Any) -> Case:
    """A save_to_disk folder of the good columns after ``change`` (which may also return a Dataset to save). With
    ``clean``, a legal variant that must read like the columns after ``clean``. ``names_path``: the error is about
    the dataset (not a config key alone) and must name its path."""
    def make(folder: Path) -> dict[str, Any]:
        _save(folder / "hf", change, dict_splits)
        made = {"path": str(folder / "hf"), **({"file": folder / "hf"} if names_path else {}), **module}
        if clean:
            _save(folder / "hf_clean", clean, dict_splits)
            made["clean"] = {**made, "path": str(folder / "hf_clean")}
        return made
    return Case(name, "hf", make, where, field, clean is not None)


def _set(column: str, value: Any, row: int | None = BAD_ROW) -> Callable[[dict[str, list[Any]]], None]:
    """One row's value (``row``) or the whole column (``row=None``)."""
    def change(columns: dict[str, list[Any]]) -> None:
        if row is None:
            columns[column] = [value] * len(columns[column])
        else:
            columns[column][row] = value
    return change


def _empty_list_in_row(column: str) -> Callable[[dict[str, list[Any]]], None]:
    """A column of lists (Arrow holds one type per column) whose row BAD_ROW is empty."""
    def change(columns: dict[str, list[Any]]) -> None:
        columns[column] = [[v] if isinstance(v, str) else v for v in columns[column]]
        columns[column][BAD_ROW] = []
    return change


def _drop_column(column: str) -> Callable[[dict[str, list[Any]]], None]:
    return lambda columns: columns.pop(column)


def _broken_folder(damage: Callable[[Path], None], label: str) -> Case:
    def make(folder: Path) -> dict[str, Any]:
        import datasets

        path = folder / "hf"
        datasets.Dataset.from_dict(_columns()).save_to_disk(str(path))
        damage(path)
        return {"path": str(path), "file": path}
    return Case(f"damaged save_to_disk folder: {label}", "hf", make)


def _local_json_folder(label: str, lines: list[bytes], where: str | None = None) -> Case:
    def make(folder: Path) -> dict[str, Any]:
        path = folder / "json_folder"
        path.mkdir()
        (path / "train.jsonl").write_bytes(_lines_file(lines))
        return {"path": str(path), "file": path}
    return Case(f"local JSON folder: {label}", "hf", make, where)


def hf_cases() -> list[Case]:
    row = f"row {BAD_ROW}"
    cases = [
        hf("query column of integers", _set("query", 7, None), "row 0", "'query'"),
        hf("query column of floats (NaN)", _set("query", float("nan"), None), "row 0", "'query'"),
        hf("query null in one row", _set("query", None), row, "'query'"),
        hf("query column of lists", _set("query", ["a", "b"], None), "row 0", "'query'"),
        hf("positive null in one row", _set("positive", None), row, "'positive'"),
        hf("positive column of nested lists", _set("positive", [["nested text"]], None), "row 0", "'positive'"),
        hf("positive list with a null", _set("positive", ["long enough text", None], None), "row 0", "'positive'"),
        hf("positive column of integers", _set("positive", 5, None), "row 0", "'positive'"),
        hf("positive column of structs", _set("positive", {"text": "long enough"}, None), "row 0", "'positive'"),
        hf("positive empty list in one row", _empty_list_in_row("positive"), row, "'positive'"),
        hf("negatives column of integers", _set("negatives", 3, None), "row 0", "'negatives'"),
        hf("negatives lists of integers", _set("negatives", [1, 2], None), "row 0", "'negatives'"),
        hf("negatives nested lists", _set("negatives", [["x y z long"]], None), "row 0", "'negatives'"),
        hf("custom query column is integers", lambda c: c.update(question=[1] * 24), "row 0", "'question'",
           columns={"query": "question"}),
        hf("no query column", _drop_column("query"), None, "'query'"),
        hf("no positive column", _drop_column("positive"), None, "'positive'"),
        hf("mapped column missing", None, None, "'question'", columns={"query": "question"}),
        hf("unknown role in data.columns", None, "data.columns", "querry", names_path=False,
           columns={"querry": "query"}),
        hf("empty query in one row", _set("query", "")),
        hf("whitespace positive in one row", _set("positive", "   \t ")),
        hf("duplicate row", lambda c: [c[k].__setitem__(BAD_ROW, c[k][0]) for k in c]),
        hf("control characters in a query", _set("query", "a real\x00\x07 query")),
        hf("format characters in a positive", _set("positive", "a long\u200b enough \ufeff positive text")),
        hf("short negative in one row", _set("negatives", ["tiny"])),
        hf("every query empty", _set("query", "", None), field="no training rows"),
        hf("zero rows", lambda c: [c[k].clear() for k in c]),
        hf("DatasetDict without the train split", dict_splits=("training",), field="training"),
        hf("validation split missing", dict_splits=("train",), field="dev", val_split="dev"),
        hf("validation split all dropped", lambda c: __import__("datasets").Dataset.from_dict(
            {**c, "query": [""] * 24}), field="no rows left", dict_splits=("train", "dev"), val_split="dev",
           train_split="dev"),
        hf("legal variant: null negatives in one row", _set("negatives", None), clean=_set("negatives", [])),
    ]
    cases += [
        _broken_folder(lambda p: (p / "dataset_info.json").write_bytes(b"\x00garbage{"), "dataset_info.json"),
        _broken_folder(lambda p: (p / "state.json").write_text("{not json"), "state.json"),
        _broken_folder(lambda p: [f.unlink() for f in p.glob("*.arrow")], "Arrow file deleted"),
        _broken_folder(lambda p: [f.write_bytes(f.read_bytes()[:100]) for f in p.glob("*.arrow")],
                       "Arrow file truncated"),
        _broken_folder(lambda p: [f.write_bytes(b"\xff" * 500) for f in p.glob("*.arrow")], "Arrow file garbage"),
    ]
    lines = [_line(r) for r in good_rows()]
    cases += [_local_json_folder("invalid JSON line", _with_defect(b"{not json")),
              _local_json_folder("mixed types in a column", _with_defect(_line(good_with(query=5)))),
              _local_json_folder("no positive field", [_line({"query": f"q {i}"}) for i in range(5)] + lines[:3])]

    def missing(folder: Path) -> dict[str, Any]:
        return {"path": str(folder / "no_such_dataset"), "file": folder / "no_such_dataset"}

    def empty_path(folder: Path) -> dict[str, Any]:
        return {"path": "", "file": "data.path"}

    cases += [Case("path does not exist (offline)", "hf", missing), Case("empty path", "hf", empty_path)]
    return cases


# --- BEIR folders -----------------------------------------------------------------------------------------------
def _bom(path: Path) -> None:
    path.write_bytes(BOM + path.read_bytes())


def _crlf(path: Path) -> None:
    path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))


def _edit_line(path: Path, line_no: int, text: bytes | None) -> None:
    """Replace (or, with None, delete) line ``line_no`` (1-based) of a file, as bytes."""
    lines = path.read_bytes().split(b"\n")
    if text is None:
        del lines[line_no - 1]
    else:
        lines[line_no - 1] = text
    path.write_bytes(b"\n".join(lines))


def beir(name: str, file: str, edit: Callable[[Path], None], where: str | None = None, field: str | None = None,
         valid: bool = False, kind: str = "beir", clean: Callable[[Path], None] | None = None) -> Case:
    """The tests' BEIR folder after ``edit(path of file)``; the error must name ``file``. A legal variant reads like
    the plain folder, or with ``clean`` like the folder after ``clean(path of file)``."""
    def make(folder: Path) -> dict[str, Any]:
        root = write_beir_folder(folder / "scifake")
        edit(root / file)
        made: dict[str, Any] = {"folder": root, "file": root / file}
        if clean:
            clean_root = write_beir_folder(folder / "clean" / "scifake")
            clean(clean_root / file)
            made["clean"] = {"folder": clean_root}
        return made
    return Case(name, kind, make, where, field, valid or clean is not None)


def beir_line(name: str, file: str, line_no: int, text: bytes | dict | None, field: str | None = None,
              kind: str = "beir", counted: bool = False) -> Case:
    """Line ``line_no`` of ``file`` replaced by ``text``."""
    raw = text if isinstance(text, bytes) or text is None else json.dumps(text).encode()
    return beir(name, file, lambda p: _edit_line(p, line_no, raw), None if counted else f"line {line_no}",
                field, kind=kind)


def _beir_json_cases(file: str, line_no: int, id_: str) -> list[Case]:
    doc = file == "corpus.jsonl"
    text = "A passage that is long enough to keep." if doc else "a query long enough"
    base = {"_id": id_, "text": text, **({"title": "T"} if doc else {})}
    cases = [beir_line(f"{file}: truncated JSON", file, line_no, json.dumps(base).encode()[:15]),
             beir_line(f"{file}: invalid UTF-8", file, line_no, b'{"_id": "' + id_.encode() + b'", "text": "\xff"}'),
             beir_line(f"{file}: binary line", file, line_no, random.Random(3).randbytes(60).replace(b"\n", b"")),
             beir_line(f"{file}: not an object", file, line_no, [id_, text]),
             beir_line(f"{file}: _id missing", file, line_no, {"text": text}, "'_id'"),
             beir_line(f"{file}: _id null", file, line_no, {**base, "_id": None}, "'_id'"),
             beir_line(f"{file}: _id float", file, line_no, {**base, "_id": 1.5}, "'_id'"),
             beir_line(f"{file}: _id boolean", file, line_no, {**base, "_id": True}, "'_id'"),
             beir_line(f"{file}: _id list", file, line_no, {**base, "_id": [id_]}, "'_id'"),
             beir_line(f"{file}: _id empty", file, line_no, {**base, "_id": ""}, "'_id'"),
             beir_line(f"{file}: duplicate _id", file, line_no, {**base, "_id": "d0" if doc else "q0"}, "_id"),
             beir_line(f"{file}: text missing", file, line_no, {"_id": id_}, "'text'"),
             beir_line(f"{file}: text null", file, line_no, {**base, "text": None}, "'text'"),
             beir_line(f"{file}: text number", file, line_no, {**base, "text": 42}, "'text'"),
             beir_line(f"{file}: text list", file, line_no, {**base, "text": [text]}, "'text'"),
             beir_line(f"{file}: _id twice", file, line_no,
                       b'{"_id": "' + id_.encode() + b'", "_id": "other", "text": "long enough text"}', "'_id'"),
             beir(f"{file}: empty file", file, lambda p: p.write_bytes(b"")),
             beir(f"{file}: missing", file, lambda p: p.unlink()),
             beir(f"legal variant: {file} with a BOM", file, _bom, valid=True),
             beir(f"legal variant: {file} with CRLF", file, _crlf, valid=True)]
    if doc:
        cases += [beir_line("corpus: title number", file, line_no, {**base, "title": 3}, "'title'"),
                  beir_line("corpus: title list", file, line_no, {**base, "title": ["T"]}, "'title'"),
                  beir_line("corpus: empty document", file, line_no, {"_id": id_, "text": ""}, counted=True),
                  beir_line("corpus: whitespace document", file, line_no, {"_id": id_, "text": " \n\t "}, counted=True),
                  beir_line("corpus: lone surrogate", file, line_no, {**base, "text": "bad \ud800 text"}, counted=True),
                  beir_line("corpus: 10 MB document", file, line_no, {**base, "text": "word " * (TEN_MB // 5)},
                            counted=True),
                  beir(f"legal variant: {file} title null", file, lambda p: _edit_line(
                      p, line_no, json.dumps({**base, "title": None}).encode()), clean=lambda p: _edit_line(
                      p, line_no, json.dumps({"_id": id_, "text": text}).encode()))]
    else:
        cases += [beir_line("queries: empty query (test split)", file, 24, {"_id": "q23", "text": ""}, counted=True),
                  beir_line("queries: lone surrogate (test split)", file, 24,
                            {"_id": "q23", "text": "why \udc00 is"}, counted=True)]
    return cases


def _qrels_cases() -> list[Case]:
    file = "qrels/test.tsv"
    cases = [beir_line(f"qrels: {label}", file, 3, text, field) for label, text, field in [
        ("2 columns", b"q23\td23", "3 tab-separated columns"),
        ("4 columns (TREC)", b"q23\t0\td23\t1", "3 tab-separated columns"),
        ("unknown query-id", b"q99\td23\t1", "'q99'"), ("unknown corpus-id", b"q23\tnope\t1", "'nope'"),
        ("query-id with a space", b"q23 \td23\t1", "'q23 '"),
        ("score word", b"q23\td23\thigh", "'high'"), ("score float", b"q23\td23\t1.5", "'1.5'"),
        ("score empty", b"q23\td23\t", "score"), ("score nan", b"q23\td23\tnan", "'nan'"),
        ("score 1e3", b"q23\td23\t1e3", "'1e3'"), ("score hex", b"q23\td23\t0x1", "'0x1'"),
        ("score with underscore", b"q23\td23\t1_0", "'1_0'"),
        ("score Arabic-Indic digit", "q23\td23\t\u0661".encode(), "score"),
        ("invalid UTF-8", b"q23\td\xff23\t1", None), ("binary", b"\x00\x01\x02\x03", None),
        ("conflicting duplicate", b"q22\td22\t0", "'d22'")]]
    cases += [beir("qrels: header only", file, lambda p: p.write_bytes(b"query-id\tcorpus-id\tscore\n"),
                   field="no query"),
              beir(f"qrels: {'header missing'}", file, lambda p: _edit_line(p, 1, b"q0\td0\t1"), "line 1", "header"),
              beir("qrels: header misspelled", file, lambda p: _edit_line(p, 1, b"qid\tdocid\tscore"), "line 1",
                   "header"),
              beir("qrels: empty file", file, lambda p: p.write_bytes(b""), "line 1", "header"),
              beir("qrels: only blank lines", file, lambda p: p.write_bytes(b"\n\n \n"), "line 1", "header"),
              beir("qrels: all scores 0", file, lambda p: p.write_bytes(p.read_bytes().replace(b"\t1\n", b"\t0\n")),
                   field="no query"),
              beir("qrels: split file missing", file, lambda p: p.unlink(), field="dev"),
              beir("qrels: repeated line", file, lambda p: p.write_bytes(p.read_bytes() + b"q22\td22\t1\n")),
              beir("legal variant: qrels with a BOM", file, _bom, valid=True),
              beir("legal variant: qrels with CRLF", file, _crlf, valid=True),
              beir("legal variant: qrels negative score", file,
                   lambda p: p.write_bytes(p.read_bytes() + b"q22\tx1\t-1\n"), valid=True)]
    return cases


def _beir_train_cases() -> list[Case]:
    """``data=beir``: the same files read as training data (queries q0-q15 and documents d0-d15 train)."""
    file = "qrels/train.tsv"
    k = "beir_train"
    return [beir_line("train: unknown corpus-id", file, 2, b"q0\tnope\t1", "'nope'", kind=k),
            beir_line("train: score word", file, 2, b"q0\td0\tyes", "'yes'", kind=k),
            beir("train: all scores 0", file, lambda p: p.write_bytes(p.read_bytes().replace(b"\t1\n", b"\t0\n")),
                 field="no query", kind=k),
            beir("train: qrels missing", file, lambda p: p.unlink(), field="dev, test", kind=k),
            beir_line("train: empty query text", "queries.jsonl", 5, {"_id": "q4", "text": ""}, kind=k, counted=True),
            beir_line("train: empty document", "corpus.jsonl", 5, {"_id": "d4", "text": ""}, kind=k, counted=True),
            beir_line("train: 10 MB document", "corpus.jsonl", 5, {"_id": "d4", "text": "x " * (TEN_MB // 2)},
                      kind=k, counted=True),
            beir_line("train: control characters in a query", "queries.jsonl", 5,
                      {"_id": "q4", "text": "how do\u0000 bees talk"}, kind=k, counted=True),
            beir("train: repeated qrels line", file, lambda p: p.write_bytes(p.read_bytes() + b"q0\td0\t1\n"), kind=k),
            beir_line("train: corpus invalid UTF-8", "corpus.jsonl", 4, b'{"_id": "d3", "text": "\xc3\x28"}', kind=k),
            beir("train: folder missing", ".", lambda p: __import__("shutil").rmtree(p), kind=k,
                 field="not a BEIR folder")]


def beir_cases() -> list[Case]:
    return (_beir_json_cases("corpus.jsonl", 3, "d2") + _beir_json_cases("queries.jsonl", 5, "q4") + _qrels_cases()
            + _beir_train_cases())


def data_cases() -> list[Case]:
    return jsonl_cases() + hf_cases() + beir_cases()
