"""Long steps without a progress bar log what is done, the rate and the time left."""

from __future__ import annotations

import logging

import pytest

from gte_pro.utils.progress import Progress


def test_known_total_gives_rate_and_eta_unknown_gives_the_rate(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="gte_pro.progress"):
        known = Progress("embedding corpus", total=1000, every_s=0.0)
        known.update(250)
        known.finish()
        unknown = Progress("tokenizing", unit="rows", every_s=0.0)
        unknown.update(4096)
        unknown.finish(5000)
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0].startswith("embedding corpus: 250 / 1000 texts, ") and " texts/s, ETA " in lines[0]
    assert lines[1].startswith("embedding corpus: 1000 texts in ")
    assert lines[2].startswith("tokenizing: 4096 rows, ") and lines[2].endswith(" rows/s") and "ETA" not in lines[2]
    assert lines[3].startswith("tokenizing: 5000 rows in ")


def test_other_ranks_and_early_updates_write_nothing(caplog: pytest.LogCaptureFixture):
    with caplog.at_level(logging.INFO, logger="gte_pro.progress"):
        Progress("embedding", total=10, every_s=0.0, quiet=True).update(5)
        Progress("embedding", total=10, every_s=3600.0).update(5)  # not yet due
    assert not caplog.records
