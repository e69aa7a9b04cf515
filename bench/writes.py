"""Rows written per document on the happy path, table by table.

``python -m bench writes`` (``BENCH_WRITES_N`` keyword documents, default 10,000): one day through
the real stages in this process, as the operators call them (retrieve, classify, persist, the
relay into a JSON-lines sink; :func:`bench.footprint._day_run`), on a scratch ledger at head. The
figures are PostgreSQL's own counters (``pg_stat_user_tables``: rows inserted, updated, deleted,
partitions summed into their table) read before and after the day, divided by the documents.

The baseline is what the naive script writes: one label row per document. The ratio says how
many row writes each guarantee of the ledger costs on top of it (issue #29 asks to cut them).
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import sqlalchemy as sa

from bench.common import Figure, scratch_database
from bench.footprint import _day_run
from triage.database import create_engine
from triage.pipeline.publish import JsonlEventSink

DAY = datetime(2026, 11, 1, tzinfo=UTC)

COUNTERS = sa.text("""
SELECT coalesce(p.relname, s.relname) AS name,
       sum(s.n_tup_ins)::bigint AS inserted, sum(s.n_tup_upd)::bigint AS updated,
       sum(s.n_tup_del)::bigint AS deleted
  FROM pg_stat_user_tables s
  LEFT JOIN pg_inherits i ON i.inhrelid = s.relid LEFT JOIN pg_class p ON p.oid = i.inhparent
 WHERE s.schemaname = 'triage' GROUP BY 1
""")


def documents() -> int:
    return int(os.environ.get("BENCH_WRITES_N", "10000"))


def _counters(engine: sa.Engine) -> dict[str, tuple[int, int, int]]:
    with engine.connect() as conn:
        # The counters reach the shared statistics when a backend flushes them: force ours, and
        # the pool's other backends were closed by dispose() before we read.
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        conn.commit()
    with engine.connect() as conn:
        return {r.name: (r.inserted, r.updated, r.deleted) for r in conn.execute(COUNTERS)}


def writes_per_document(n: int) -> dict[str, dict[str, float]]:
    """``{table: {"inserted", "updated", "deleted"}}`` per document for one day of ``n`` documents
    (tables that were not written are left out)."""
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        engine = create_engine(url, pool_size=4)
        before = _counters(engine)
        sink = JsonlEventSink(home / "events" / "outbox.jsonl")
        try:
            _day_run(engine, str(home / "payloads"), sink, n, DAY)
        finally:
            sink.close()
        engine.dispose()  # every backend of the run exits, so its counters are flushed
        engine = create_engine(url, pool_size=1)
        after = _counters(engine)
        engine.dispose()
    table: dict[str, dict[str, float]] = {}
    for name, (ins, upd, dele) in after.items():
        b = before.get(name, (0, 0, 0))
        delta = (ins - b[0], upd - b[1], dele - b[2])
        if any(delta):
            table[name] = {k: round(v / n, 3) for k, v in zip(("inserted", "updated", "deleted"), delta, strict=True)}
    return table


def run() -> list[Figure]:
    n = documents()
    table = writes_per_document(n)
    total = sum(sum(row.values()) for row in table.values())
    return [
        Figure(
            "rows written per document (happy path)",
            "rows",
            round(total, 2),
            "naive script (one label row)",
            1.0,
            target_ratio=None,
            higher_is_better=False,
            details={"documents": n, "by_table": table},
        )
    ]
