"""Flat to 10 million: what a document costs as the ledger grows (issue #16, item 3).

``python -m bench growth`` (``make bench-growth``; ``BENCH_GROWTH_SIZES``, default
``100000,1000000``; add ``10000000`` where disk and an hour allow): the ledger is bulk-loaded
(:mod:`bench.simulation.bulk`: one statement per half-million jobs, triggers aside) as the past
of a deployment classifying 10,000 documents a day (100,000 jobs: 10 days; 1M: 100 days; 10M:
1,000), holding what the default retention keeps (the last 30 days' transitions and
classifications, the last 7 days' outbox, every label, the reviews of the last 7 days open).
At each size a day's work is timed through the ledger: registering 10,000 documents, claiming
and completing them (CPU microseconds per document, this process's and PostgreSQL's: the
machine is shared, wall time is not comparable), one reconciliation (CPU seconds), and the review
queue page at its head and half way down (the 8 KiB pages it reads, EXPLAIN ANALYZE's buffers;
its milliseconds in the details). Each figure is against the same at the first
size: flat is within ±20 %. Reconciliation's statements slower than 50 ms are EXPLAINed.

After the day's work the database is vacuumed (what autovacuum would do about it: the server's
CPU is the figure, and an autovacuum beside a timed run would count as the run's), reconciliation
runs once untimed (the deployment's previous 15-minute run; the first run after a bulk load reads
a cold cache no deployment has), then three times, timed, without the consistency grace (the
day's jobs are checked, as a run minutes later would); the figure is the median run's CPU
seconds, all three in the details.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from bench.common import Figure, scratch_database, server_cpu_seconds, timed
from bench.review_queue import median_ms, middle_cursor
from bench.simulation import bulk
from tests.ledger.helpers import drop_legacy_partitions, new_jobs, past_day_partitions
from triage.database import DatabaseUrl, create_engine
from triage.jobs.schema import manual_review
from triage.jobs.sql.reads.review_queue import QueueFilter, queue_statement
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.web.service import TriageService

DAY_N = bulk.DAILY  # today's work, on top of the loaded days
RECONCILE_RUNS = 3  # after the day's work, one after the other: the median's CPU is the figure
CHUNK = 5_000
VERSION = bulk.VERSION


def sizes() -> list[int]:
    return [int(s) for s in os.environ.get("BENCH_GROWTH_SIZES", "100000,1000000").split(",")]


@contextmanager
def _statements(engine: sa.Engine) -> Iterator[list[tuple[float, str, Any]]]:
    """Each statement ``engine`` runs in the block: (seconds, SQL, parameters)."""
    seen: list[tuple[float, str, Any]] = []

    def before(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        conn.info["bench_started"] = time.perf_counter()

    def after(conn: Any, cursor: Any, statement: str, parameters: Any, *rest: Any) -> None:
        seen.append((time.perf_counter() - conn.info.pop("bench_started"), statement, parameters))

    sa.event.listen(engine, "before_cursor_execute", before)
    sa.event.listen(engine, "after_cursor_execute", after)
    try:
        yield seen
    finally:
        sa.event.remove(engine, "before_cursor_execute", before)
        sa.event.remove(engine, "after_cursor_execute", after)


def _cpu_timed(fn: Any) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds (this process's and the server's: the machine is shared, so the
    CPU is the figure that compares across sizes), and the result of ``fn``."""
    own, server = time.process_time(), server_cpu_seconds() or 0.0
    wall, result = timed(fn)
    return wall, time.process_time() - own + (server_cpu_seconds() or 0.0) - server, result


def _explain(engine: sa.Engine, statement: str, parameters: Any) -> list[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
    return [r[0].strip() for r in rows if "Scan" in r[0]][:8]


def _day(store: JobStore, size: int) -> dict[str, float]:
    """A new day's work on the ledger: register, then claim and complete, timed."""
    batch = f"growth-{size}"
    docs = new_jobs(DAY_N, prefix=batch)
    register_s, register_cpu, _ = _cpu_timed(
        lambda: [
            store.register(docs[i : i + CHUNK], batch_key=batch, step="classify", max_attempts=3)
            for i in range(0, DAY_N, CHUNK)
        ]
    )
    label = LabelWrite("billing", 0.9, VERSION)
    answer = ClassificationRecord("billing", 0.9, "accepted", VERSION)

    def claim_complete() -> int:
        done = 0
        while True:
            claim = store.claim(
                batch_key=batch,
                step="classify",
                limit=1000,
                lease_seconds=60,
                owner="bench",
                classifier_version=VERSION,
            )
            if not claim.jobs:
                return done
            store.record(claim, [Complete(j.id, j.attempt, label, answer) for j in claim.jobs])
            done += len(claim.jobs)

    complete_s, complete_cpu, done = _cpu_timed(claim_complete)
    assert done == DAY_N, done
    return {
        "register_docs_per_s": DAY_N / register_s,
        "claim_complete_jobs_per_s": DAY_N / complete_s,
        "register_cpu_us_per_doc": 1e6 * register_cpu / DAY_N,
        "claim_complete_cpu_us_per_job": 1e6 * complete_cpu / DAY_N,
    }


def _queue_ms(engine: sa.Engine, store: JobStore) -> dict[str, float]:
    service = TriageService(store, payload_base="/nonexistent", taxonomy_names=[])
    with engine.connect() as conn:
        open_reviews = conn.execute(
            sa.select(sa.func.count()).where(manual_review.c.resolved_at.is_(None))
        ).scalar_one()
        middle = middle_cursor(conn, open_reviews)
    out = {}
    for name, after in (("head", None), ("deep", middle)):
        page = functools.partial(service.queue, QueueFilter(), limit=50, after=after)
        out[f"queue_page_{name}_ms"] = median_ms(page, repeats=5)
        out[f"queue_page_{name}_buffers"] = _page_buffers(engine, after)
    return out


def _page_buffers(engine: sa.Engine, after: Any) -> int:
    """The 8 KiB pages one queue page reads (EXPLAIN ANALYZE's shared buffers, hit or read): what
    the page costs whatever else the machine does."""
    params: dict[str, Any] = {"limit": 51}
    if after is not None:
        params["after_at"], params["after_id"] = after
    compiled = queue_statement(frozenset(), after is not None).compile(dialect=engine.dialect)
    with engine.connect() as conn:
        plan = conn.exec_driver_sql(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + str(compiled), compiled.construct_params(params)
        ).scalar_one()
    top = plan[0]["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"])


def _reconcile(store: JobStore) -> tuple[float, float, Any]:
    # No grace: a deployment's runs come minutes after the work they check, so the day's jobs are
    # in the consistency checks' window (a run within the 60 s grace of the day's work would skip
    # them, and leave the planner a window too small to show how it reads a full day).
    return _cpu_timed(lambda: reconcile(store, ReconcileParams(grace_seconds=0), reports_dir=None))


def _measure(url: DatabaseUrl, engine: sa.Engine, size: int) -> dict[str, Any]:
    store = JobStore(engine)
    figures: dict[str, Any] = _day(store, size)
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        # What autovacuum would do about the day's 20,000 updates, done before the timed runs:
        # the server's CPU is the figure, and an autovacuum of jobs (2 % of the table: due at 1M,
        # not at 10M) running beside a timed run would be counted as the run's.
        conn.execute("VACUUM ANALYZE")
        conn.execute(
            "CHECKPOINT"
        )  # the pages the load and the vacuum dirtied: the checkpointer's CPU is the server's too
    _reconcile(store)  # the deployment's previous 15-minute run (not timed): the first after a bulk load is no figure
    runs = []
    with _statements(engine) as seen:
        for _ in range(RECONCILE_RUNS):
            runs.append(_reconcile(store))
            if len(runs) < RECONCILE_RUNS:
                seen.clear()
    seconds, cpu, outcome = sorted(runs, key=lambda r: r[1])[len(runs) // 2]
    figures["reconcile_seconds"] = seconds
    figures["reconcile_cpu_seconds"] = cpu
    figures["reconcile_cpu_seconds_runs"] = [round(r[1], 3) for r in runs]
    figures.update(_queue_ms(engine, store))
    slow = sorted(seen, key=lambda s: -s[0])[:6]
    figures["reconcile_slowest"] = [
        {"ms": round(1000 * s, 1), "sql": " ".join(sql.split())[:160], "plan": _explain(engine, sql, params)}
        for s, sql, params in slow
        if s > 0.05
    ]
    with engine.connect() as conn:
        figures["database_bytes_per_job"] = round(
            conn.execute(sa.text("SELECT pg_database_size(current_database())")).scalar_one() / size
        )
    figures["findings"] = sorted({f.check for r in outcome.results for f in r.findings})
    return figures


def bench_growth() -> list[Figure]:
    targets = sorted(sizes())
    results: dict[int, dict[str, Any]] = {}
    with scratch_database() as url:
        with psycopg.connect(url.libpq(), autocommit=True) as conn:
            drop_legacy_partitions(conn)
            today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            for ago in range(1, bulk.EVENT_DAYS + 1):
                past_day_partitions(conn, today - timedelta(days=ago))  # older ones were dropped
        engine = create_engine(url, pool_size=4)
        loaded = 0
        for size in targets:
            load_s = bulk.load_retained(url, loaded, size - DAY_N)
            loaded = size - DAY_N
            results[size] = {"load_seconds": round(load_s, 1), **_measure(url, engine, size)}
            loaded = size  # the measured day's jobs are part of the ledger now
            print(f"growth at {size:,}: {results[size]}", flush=True)
        engine.dispose()
    base = results[targets[0]]
    figures = []
    for size in targets[1:]:
        at = results[size]
        for key, unit, higher in (
            ("register_cpu_us_per_doc", "CPU µs", False),
            ("claim_complete_cpu_us_per_job", "CPU µs", False),
            ("reconcile_cpu_seconds", "CPU s", False),
            ("queue_page_head_buffers", "pages", False),
            ("queue_page_deep_buffers", "pages", False),
        ):
            figures.append(
                Figure(
                    f"growth: {key} at {size:,} jobs",
                    unit,
                    at[key],
                    f"the same at {targets[0]:,} jobs",
                    base[key],
                    target_ratio=0.8 if higher else 1.2,
                    higher_is_better=higher,
                    details={"at": at, "baseline": base} if key == "reconcile_cpu_seconds" else {},
                )
            )
    return figures


def run() -> list[Figure]:
    return bench_growth()
