"""The row sets of a chunk encoded by msgspec (:func:`triage.jobs.store.recording.plain_rowset`),
not ``json.dumps`` (:func:`triage.jobs.sql.expressions.rowset`): the same JSON values for what
the rows hold, so ``json_to_recordset`` reads the same rows (``tests/ledger/test_chunk_rows.py``
compares what is written)."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from triage.jobs.sql.expressions import rowset
from triage.jobs.store.recording import plain_rowset, without_nulls

ROWS = [
    pytest.param({"id": uuid.UUID(int=7).hex, "attempt": 1, "error": None}, id="hex-id-int-null"),
    pytest.param({"reused_job_id": uuid.UUID(int=2**127 + 5)}, id="uuid-as-str-writes-it"),
    pytest.param({"confidence": 1e-05, "latency_ms": 0.016865000361576676, "big": 1e16, "tiny": 5e-324}, id="floats"),
    pytest.param({"confidence": 0.0, "ok": True, "no": False, "empty": "", "count": 2**63}, id="falsy-and-big"),
    pytest.param({"error": '« ü » \u2028 \x00 \t " \\ 😀'}, id="text-beyond-ascii-and-escapes"),
    pytest.param(
        {"candidates": [{"label": "billing", "score": 0.9989}, {"label": "refund", "score": 0.05}]}, id="nested"
    ),
]


@pytest.mark.parametrize("row", ROWS)
def test_plain_rowset_holds_the_values_json_dumps_wrote(row: dict[str, Any]) -> None:
    plain = plain_rowset("given", [row, row])
    assert list(plain) == ["given_rows"]
    assert json.loads(plain["given_rows"]) == json.loads(rowset("given", [row, row])["given_rows"])


def test_a_lone_surrogate_is_escaped_as_json_dumps_escapes_it() -> None:
    """msgspec cannot encode it as UTF-8; the rows then go as ``json.dumps`` writes them, for
    PostgreSQL to refuse as it did (never a different error in this process)."""
    row = {"error": "bad \ud800 text"}
    assert plain_rowset("held", [row]) == rowset("held", [row])


def test_without_nulls_drops_only_none() -> None:
    row: dict[str, Any] = {"a": None, "b": 0, "c": 0.0, "d": "", "e": False, "f": [], "g": "x"}
    assert without_nulls(row) == {"b": 0, "c": 0.0, "d": "", "e": False, "f": [], "g": "x"}
