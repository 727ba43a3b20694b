"""The input of ``mode=score`` in fixed shards, and the shards' files: what makes the run resumable and the same
for any number of ranks.

Shard i is the rows ``[i * shard_rows, (i + 1) * shard_rows)`` of the input (non-blank lines, in order), whatever
the world size; rank r of W scores shards r, r + W, ... . A finished shard is two files in ``<run dir>/score_shards``,
each written atomically: ``<i>.jsonl`` (its scored lines) and then ``<i>.json`` (its marker: the settings and input
fingerprints it was scored with, the data file's size and SHA-256, and its scores for the report). A shard is done
when its marker is there; a shard whose marker names other settings (another teacher, max_length, batch_size or
shard_rows) or other input rows is refused, never mixed into the output. Rank 0 writes the output by copying the
shards' files in order, checking each one's SHA-256 on the way.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gte_pro.data.records import Example, iter_jsonl, parse_record
from gte_pro.data.scores import SCORE_FIELDS
from gte_pro.errors import DataError, ResumeError
from gte_pro.utils.files import remove_stale_temporaries, write_atomic, write_json_atomic

SHARD_FORMAT = 1
COPY_BYTES = 1 << 20


@dataclass
class Row:
    line: int  # the line number in the input file (1-based)
    record: dict[str, Any]  # the row as read: written back unchanged, plus the scores
    example: Example  # its texts, validated


@dataclass
class Shard:
    index: int
    rows: list[Row] = field(default_factory=list)

    def digest(self) -> str:
        """A fingerprint of the shard's rows (their content as read, in order)."""
        hasher = hashlib.blake2b(digest_size=16)
        for row in self.rows:
            hasher.update(json.dumps(row.record, sort_keys=True, ensure_ascii=False).encode())
            hasher.update(b"\n")
        return hasher.hexdigest()


def read_row(record: Any, where: str) -> Example:
    """A training row's texts, validated as training reads them (``gte_pro.data.records.parse_record``); scores it
    already has are left out of the check, since scoring replaces them."""
    if isinstance(record, dict):
        record = {key: value for key, value in record.items() if key not in SCORE_FIELDS}
    return parse_record(record, where)


def iter_shards(path: str | Path, shard_rows: int) -> Iterator[Shard]:
    """The shards of a JSON-lines training file, one at a time; a bad row raises DataError naming file, line and
    field."""
    shard = Shard(0)
    for line_no, record in iter_jsonl(path):
        example = read_row(record, f"{path}, line {line_no}")
        shard.rows.append(Row(line_no, record, example))
        if len(shard.rows) == shard_rows:
            yield shard
            shard = Shard(shard.index + 1)
    if shard.rows:
        yield shard


def fingerprint(blob: Any) -> str:
    return hashlib.blake2b(json.dumps(blob, sort_keys=True).encode(), digest_size=16).hexdigest()


class ShardFolder:
    """``<run dir>/score_shards``: the finished shards of one scoring run (see the module's docstring)."""

    def __init__(self, folder: Path, settings: dict[str, Any]) -> None:
        self.folder = folder
        self.settings = settings
        self.settings_key = fingerprint({"format": SHARD_FORMAT, **settings})

    def data_path(self, index: int) -> Path:
        return self.folder / f"{index:06d}.jsonl"

    def marker_path(self, index: int) -> Path:
        return self.folder / f"{index:06d}.json"

    def prepare(self) -> None:
        """Make the folder; remove temporary files that a killed run left there (only those of dead processes)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_stale_temporaries(self.folder)

    def finished(self, index: int, digest: str) -> dict[str, Any] | None:
        """The marker of shard ``index`` if it was scored, from these rows with these settings; None if it was not
        scored. A shard scored from other rows or with other settings raises ResumeError."""
        path = self.marker_path(index)
        if not path.is_file():
            return None
        marker = json.loads(path.read_text(encoding="utf-8"))
        hint = f"score into a new run folder, or delete {self.folder} to score every shard again"
        if marker.get("settings_key") != self.settings_key:
            before = marker.get("settings", {})
            changed = [f"{key}: {json.dumps(before.get(key))} then, {json.dumps(self.settings.get(key))} now"
                       for key in sorted({**self.settings, **before}) if before.get(key) != self.settings.get(key)]
            what = "; ".join(changed) or "an older format"
            raise ResumeError(f"{path}: shard {index} was scored with other settings ({what}); scores of two "
                              "teachers or settings are never mixed in one file", hint=hint)
        if marker.get("input_digest") != digest:
            raise ResumeError(f"{path}: shard {index} (rows {marker.get('first_line')}.. of the input) was scored "
                              "from other rows: the input file changed since", hint=hint)
        data = self.data_path(index)
        if not data.is_file() or data.stat().st_size != marker.get("bytes"):
            return None  # the data file is missing or not the one the marker describes: score the shard again
        return marker

    def write(self, index: int, digest: str, lines: list[str], stats: dict[str, Any]) -> dict[str, Any]:
        """Write shard ``index`` (its data, then its marker, each atomically); return the marker."""
        blob = "".join(line + "\n" for line in lines).encode("utf-8")
        write_atomic(self.data_path(index), lambda tmp: tmp.write_bytes(blob))
        marker = {"format": SHARD_FORMAT, "index": index, "settings_key": self.settings_key,
                  "settings": self.settings, "input_digest": digest, "bytes": len(blob),
                  "sha256": hashlib.sha256(blob).hexdigest(), **stats}
        write_json_atomic(self.marker_path(index), marker)
        return marker

    def markers(self, count: int) -> list[dict[str, Any]]:
        """The markers of shards 0 .. count - 1, each one's scores as a float32 array (4 bytes a score, not a
        Python float's 32: a file of 1M rows x 16 texts is 64 MB of scores)."""
        markers = []
        for index in range(count):
            marker = json.loads(self.marker_path(index).read_text(encoding="utf-8"))
            for key in SCORE_FIELDS:
                marker[key] = np.asarray(marker[key], dtype=np.float32)
            markers.append(marker)
        return markers

    def assemble(self, output: Path, markers: list[dict[str, Any]]) -> Path:
        """The output file: the shards' data in order (written atomically); a shard whose data no longer has the
        checksum of its marker raises DataError naming it."""
        def fill(tmp: Path) -> None:
            with tmp.open("wb") as sink:
                for marker in markers:
                    path = self.data_path(marker["index"])
                    hasher = hashlib.sha256()
                    with path.open("rb") as source:
                        while chunk := source.read(COPY_BYTES):
                            hasher.update(chunk)
                            sink.write(chunk)
                    if hasher.hexdigest() != marker["sha256"]:
                        raise DataError(f"{path}: changed since it was scored (its SHA-256 is not its marker's)",
                                        hint=f"delete it and {self.marker_path(marker['index']).name}, then run the "
                                             "same command again: that shard is scored again")

        return write_atomic(output, fill)
