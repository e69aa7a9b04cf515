"""Bytes per document: what a day of classification leaves behind, before and after retention.

``python -m bench footprint`` (``BENCH_FOOTPRINT_N`` documents a day, default 50,000, for
``BENCH_FOOTPRINT_DAYS`` days, default 2): days of keyword documents through the real stages
(retrieve, classify, persist, the relay into the JSON-lines sink), vacuumed between days as
autovacuum would, once on the ledger as it was before retention (revision 0013: plain log and
outbox, autovacuum at 20 %) and once at head, each on a database of its own. Measured after
each day: the job database's bytes per document by table (partitions summed into their table),
the jobs table's updates and HOT updates (``pg_stat_user_tables``) and average row, the
payloads' and the event file's bytes. Then, at head, the reviews are decided, every row but the
jobs' own is aged 60 days (by the owner, as the tests do) and ``triage_maintenance``'s
retention applied: what is left per document is what a retained document costs.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import sqlalchemy as sa

from bench.common import Figure, scratch_database
from bench.simulation import bulk
from tests.ledger.helpers import age_rows, drop_legacy_partitions, past_day_partitions
from triage import migrations
from triage.classifiers import Taxonomy, build_classifier
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.maintenance.retention import apply_retention
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.one_transaction import run_step_in_chunks
from triage.pipeline.persist import PersistHandler
from triage.pipeline.publish import JsonlEventSink, publish_all
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, run_step
from triage.settings import Retention
from triage.sources.synthetic import SyntheticSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)

TABLES = sa.text("""
SELECT coalesce(p.relname, c.relname) AS name, sum(pg_total_relation_size(c.oid))::bigint AS bytes
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_inherits i ON i.inhrelid = c.oid LEFT JOIN pg_class p ON p.oid = i.inhparent
 WHERE n.nspname = 'triage' AND c.relkind IN ('r', 'm') GROUP BY 1 ORDER BY 2 DESC
""")
JOBS_STATS = sa.text("""
SELECT n_tup_upd, n_tup_hot_upd, n_dead_tup, n_live_tup, pg_relation_size(relid) AS heap,
       pg_total_relation_size(relid) AS total,
       (SELECT avg(pg_column_size(j.*)) FROM triage.jobs j) AS row_bytes
  FROM pg_stat_user_tables WHERE schemaname = 'triage' AND relname = 'jobs'
""")


def documents() -> int:
    return int(os.environ.get("BENCH_FOOTPRINT_N", "50000"))


def days() -> int:
    return int(os.environ.get("BENCH_FOOTPRINT_DAYS", "2"))


def _day_run(engine: sa.Engine, payloads: str, sink: JsonlEventSink, n: int, day: datetime) -> None:
    """One day through the stages in this process, as the operators call them."""
    store = JobStore(engine)
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    batch = f"{day:%Y-%m-%d}"
    retrieve(
        store,
        SyntheticSource(n, seed=day.toordinal()),
        PayloadStore(payloads),
        start=day,
        end=day + timedelta(days=1),
        batch_key=batch,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    handler = ClassifyHandler(classifier, PayloadStore(payloads), ClassifySettings(0.7, 1))
    try:
        # As a keyword classify task's first try: each chunk claimed, classified and completed in one transaction.
        run_step_in_chunks(
            store, handler, batch_key=batch, settings=RunSettings(owner="bench/classify", progress_every_seconds=1e9)
        )
    finally:
        handler.close()
    run_step(store, PersistHandler(store), batch_key=batch, settings=RunSettings(owner="bench/persist"))
    publish_all(store, sink)


def _folder_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.exists() else 0


def _measure(engine: sa.Engine, docs: int, home: Path) -> dict[str, Any]:
    with engine.connect() as conn:
        conn.execute(sa.text("SELECT pg_stat_force_next_flush()"))
        tables = {r.name: int(r.bytes) for r in conn.execute(TABLES)}
        jobs = conn.execute(JOBS_STATS).one()
    files = {"payloads": _folder_bytes(home / "payloads"), "event_files": _folder_bytes(home / "events")}
    total = sum(tables.values()) + sum(files.values())
    return {
        "documents": docs,
        "bytes_per_document": round(total / docs),
        "database_bytes_per_document": round(sum(tables.values()) / docs),
        "by_table_per_document": {k: round(v / docs) for k, v in tables.items() if v / docs >= 1},
        "files_per_document": {k: round(v / docs) for k, v in files.items()},
        "jobs": {
            "updates": jobs.n_tup_upd,
            "hot_updates": jobs.n_tup_hot_upd,
            "hot_ratio": round(jobs.n_tup_hot_upd / max(1, jobs.n_tup_upd), 3),
            "dead_rows": jobs.n_dead_tup,
            "heap_bytes_per_job": round(jobs.heap / docs),
            "average_row_bytes": round(float(jobs.row_bytes or 0)),
            "total_bytes_per_job": round(jobs.total / docs),
        },
    }


def _ledger(url: DatabaseUrl, revision: str, n: int, retention: bool) -> dict[str, Any]:
    """:func:`days` days of ``n`` documents on a ledger at ``revision``, vacuumed between days
    as autovacuum would; measured after each day (and, at head, after retention)."""
    migrations.upgrade(url, revision)
    out: dict[str, Any] = {"revision": revision}
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp)
        engine = create_engine(url, pool_size=4)
        if retention:
            with psycopg.connect(url.libpq(), autocommit=True) as conn:
                drop_legacy_partitions(conn)
        sink = JsonlEventSink(home / "events" / "outbox.jsonl")
        try:
            for day in range(1, days() + 1):
                _day_run(engine, str(home / "payloads"), sink, n, DAY + timedelta(days=day - 1))
                out[f"after_day_{day}"] = _measure(engine, day * n, home)
                with psycopg.connect(url.libpq(), autocommit=True) as conn:
                    conn.execute("VACUUM triage.jobs")  # what autovacuum does between days
        finally:
            sink.close()
        if retention:
            out["after_retention"] = _expire(url, engine, home, days() * n)
        engine.dispose()
    return out


def _expire(url: DatabaseUrl, engine: sa.Engine, home: Path, docs: int) -> dict[str, Any]:
    """Reviews decided, every row but the jobs' own aged 60 days (the jobs rows are what is
    retained: a new version of each would be the bench's bloat, not the ledger's), the default
    retention applied, vacuumed; measure what is left."""
    at = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=60)
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        bulk.reject_reviews(conn)
        past_day_partitions(conn, at)
        age_rows(conn, at + timedelta(hours=12), jobs=False)
        conn.execute(
            "VACUUM triage.jobs, triage.job_events, triage.outbox, triage.classifications, triage.document_labels"
        )
    old = (datetime.now(UTC) - timedelta(days=60)).timestamp()
    for path in [*(home / "payloads").rglob("*"), *(home / "events").rglob("*")]:
        if path.is_file():
            os.utime(path, (old, old))
    report = apply_retention(
        engine,
        Retention(),
        payload_base=str(home / "payloads"),
        event_log=str(home / "events" / "outbox.jsonl"),
        reports_dir=str(home / "reports"),
    )
    # The rotated file was just written (the rename keeps its time): a day later it goes too.
    for path in (home / "events").glob("outbox.jsonl.*"):
        os.utime(path, (old, old))
    apply_retention(
        engine,
        Retention(),
        payload_base=str(home / "payloads"),
        event_log=str(home / "events" / "outbox.jsonl"),
        reports_dir=str(home / "reports"),
    )
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        conn.execute("VACUUM triage.jobs, triage.classifications")
    measured = _measure(engine, docs, home)
    measured["removed"] = {k: {"removed": v.removed, "bytes": v.bytes} for k, v in report.kinds.items()}
    return measured


def bench_footprint() -> list[Figure]:
    n = documents()
    with scratch_database(migrate=False) as url:
        before = _ledger(url, "0013", n, retention=False)
    with scratch_database(migrate=False) as url:
        after = _ledger(url, "head", n, retention=True)
    return [
        Figure(
            "bytes per document, retained (after retention)",
            "bytes",
            after["after_retention"]["bytes_per_document"],
            f"before retention (0013, {days()} days)",
            before[f"after_day_{days()}"]["bytes_per_document"],
            target_ratio=None,
            higher_is_better=False,
            details={"goal_bytes": 1536, "before": before, "after": after},
        )
    ]


def run() -> list[Figure]:
    return bench_footprint()
