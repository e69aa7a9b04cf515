"""``python -m bench writes`` counts the rows each document writes, table by table, from
PostgreSQL's own counters: on the happy path every job is inserted once and leaves one
classification, and every table the pipeline writes shows up."""

from __future__ import annotations

import pytest

from bench import writes
from triage.database import DatabaseUrl


def test_writes_per_document_counts_each_table(pg_server: DatabaseUrl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", pg_server.libpq())

    table = writes.writes_per_document(200)

    assert table["jobs"]["inserted"] == 1.0
    # One move after its registration: claimed, classified and completed in one transaction (issue #29).
    assert table["jobs"]["updated"] == 1.0
    assert table["classifications"]["inserted"] == 1.0
    labelled = table["document_labels"]["inserted"] + table.get("manual_review", {}).get("inserted", 0.0)
    assert labelled == pytest.approx(1.0)  # each document is labelled or sent to a human
    assert table["job_events"]["inserted"] == 2.0  # registered, then completed or sent to review
    assert table["outbox"]["inserted"] >= 1.0
