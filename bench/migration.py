"""How long migration 0015 (the log and the outbox partitioned by day) takes on a populated ledger.

``python -m bench migration`` (``BENCH_MIGRATION_N`` jobs, default 1,000,000): a ledger at
revision 0013 bulk-loaded with its whole history (three transitions, two outbox events, a
classification and a label per job), then ``alembic upgrade head`` timed. The upgrade holds
``ACCESS EXCLUSIVE`` on both tables for that long (docs/operations.md).
"""

from __future__ import annotations

import os
import time

import psycopg
import sqlalchemy as sa

from bench.common import Figure, scratch_database
from bench.simulation import bulk
from triage import migrations
from triage.database import create_engine

SIZES = sa.text(
    "SELECT relname, pg_total_relation_size(relid) FROM pg_stat_user_tables"
    " WHERE schemaname = 'triage' AND relname IN ('jobs', 'job_events', 'outbox')"
)


def jobs() -> int:
    return int(os.environ.get("BENCH_MIGRATION_N", "1000000"))


def bench_migration() -> list[Figure]:
    n = jobs()
    with scratch_database(migrate=False) as url:
        migrations.upgrade(url, "0013")
        started = time.perf_counter()
        with psycopg.connect(url.libpq(), autocommit=True) as conn:
            bulk.load_history(conn, n)
        load_s = time.perf_counter() - started
        engine = create_engine(url, poolclass=sa.NullPool)
        with engine.connect() as conn:
            sizes = {name: int(size) for name, size in conn.execute(SIZES)}
            rows = {
                t: conn.execute(sa.text(f"SELECT count(*) FROM triage.{t}")).scalar_one()
                for t in ("jobs", "job_events", "outbox")
            }
        started = time.perf_counter()
        migrations.upgrade(url)
        upgrade_s = time.perf_counter() - started
        with engine.connect() as conn:
            after = {
                t: conn.execute(sa.text(f"SELECT count(*) FROM triage.{t}")).scalar_one()
                for t in ("job_events", "outbox")
            }
        engine.dispose()
    assert after == {t: rows[t] for t in after}, (after, rows)
    return [
        Figure(
            f"migration 0015 on {n:,} jobs",
            "s",
            upgrade_s,
            "loading that ledger",
            load_s,
            higher_is_better=False,
            details={"rows": rows, "bytes_before": sizes},
        )
    ]


def run() -> list[Figure]:
    return bench_migration()
