"""``python -m bench ledger-days``: days back to back on one ledger, each day's figures and counters."""

from __future__ import annotations

import pytest

from bench import ledger_days
from triage.database import DatabaseUrl


def test_each_day_reports_its_statements_and_the_tables(
    pg_server: DatabaseUrl, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIAGE_DATABASE_URL", pg_server.libpq())

    rows = ledger_days.ledger_days(2, 200)

    assert [r["day"] for r in rows] == [1, 2]
    assert all(set(r["tables"]) == {"jobs", "classifications", "document_labels"} for r in rows)
    assert rows[-1]["jobs_total_mb"] > 0
    assert rows[-1]["beside_server"] is None  # a configured server's CPU is not this machine's to read
