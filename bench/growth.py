"""Flat to 10 million: what a document costs as the ledger grows (issue #16, item 3).

``python -m bench growth`` (``make bench-growth``; ``BENCH_GROWTH_SIZES``, default
``100000,1000000``; add ``10000000`` where disk and an hour allow): the ledger is bulk-loaded
(one set-based INSERT per half-million jobs, triggers aside, as a simulation of ~100 days:
jobs of every day, and what retention keeps of the rest: the last 30 days' transitions and
classifications, the last 7 days' outbox, every label, an open review for 1 % of the jobs), and
at each size a new day's work is timed through the ledger: registering 20,000 documents,
claiming and completing them, one reconciliation, and the review queue page at its head and half
way down. Each figure is that size's cost per document (or per run, per page) against the same
at the first size: flat is within ±20 %. Reconciliation's statements slower than 50 ms are
EXPLAINed, to show what they read.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import sqlalchemy as sa

from bench.common import Figure, scratch_database, timed
from tests.integration.helpers import drop_legacy_partitions, new_jobs, past_day_partitions
from triage.database import DatabaseUrl, create_engine
from triage.jobs.models import ClassificationRecord, Complete, LabelWrite
from triage.jobs.review_queue import QueueFilter
from triage.jobs.schema import manual_review
from triage.jobs.store import JobStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.web.service import TriageService

DAYS = 100
EVENT_DAYS, OUTBOX_DAYS = 30, 7  # what the default retention keeps
DAY_N = 20_000
CHUNK = 5_000
LOAD_CHUNK = 500_000
VERSION = new_jobs(1)[0].classifier_version

# One job of the simulation per i: its day is i % DAYS (0 = today), its shape a real job's
# (keys, references and hashes of the same lengths as retrieve writes).
LOAD_JOBS = """
INSERT INTO triage.jobs (id, idempotency_key, source, external_id, content_sha256, payload_ref,
    classifier_version, correlation_id, batch_key, step, status, status_reason, attempt, max_attempts,
    created_at, updated_at)
SELECT (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0') || '7' || substr(t.h, 14, 3) || '8'
        || substr(t.h, 18, 15))::uuid,
       'synthetic/21:' || t.ext || '/' || t.sha || '/{version}', 'synthetic', t.ext, t.sha,
       'file:///var/lib/triage/payloads/' || substr(t.sha, 1, 2) || '/' || t.sha || '#offset=' || mod(t.i, 5000) * 451
           || '&length=451',
       '{version}', gen_random_uuid()::text, to_char(t.at, 'YYYY-MM-DD'), 'classify',
       t.status::triage.job_status, t.status, 1, 3, t.at, t.at + interval '2 minutes'
  FROM (SELECT i::bigint AS i, md5(i::text) AS h, encode(sha256(i::text::bytea), 'hex') AS sha,
               'syn-' || lpad(i::text, 9, '0') AS ext,
               date_trunc('day', now()) - make_interval(days => mod(i, {days})) + make_interval(secs => mod(i, 86000)) AS at,
               CASE WHEN mod(i, 100) = 7 THEN 'manual_review' WHEN mod(i, 50) = 3 THEN 'terminal_failed'
                    ELSE 'completed' END AS status
          FROM generate_series(%(lo)s, %(hi)s - 1) AS i) t
"""


def sizes() -> list[int]:
    return [int(s) for s in os.environ.get("BENCH_GROWTH_SIZES", "100000,1000000").split(",")]


def _ext(i: int) -> str:
    return f"syn-{i:09d}"


def _load(url: DatabaseUrl, lo: int, hi: int) -> float:
    """Jobs ``lo``..``hi`` of the simulation and what the retention keeps of their rows."""
    started = time.perf_counter()
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # the triggers' log is written here
        for a in range(lo, hi, LOAD_CHUNK):
            b = min(hi, a + LOAD_CHUNK)
            with conn.transaction():
                conn.execute(LOAD_JOBS.format(version=VERSION, days=DAYS), {"lo": a, "hi": b})  # type: ignore[arg-type]
                span = {"lo_ext": _ext(a), "hi_ext": _ext(b)}
                recent = "j.external_id >= %(lo_ext)s AND j.external_id < %(hi_ext)s"
                conn.execute(
                    "INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason, at)"
                    " SELECT j.id, m.f::triage.job_status, coalesce(m.t, j.status::text)::triage.job_status,"
                    " 'classify', 1, 'bench/classify/0/try1', coalesce(m.t, j.status::text), j.created_at + m.o"
                    " FROM triage.jobs j CROSS JOIN (VALUES (NULL, 'queued', interval '0'),"
                    " ('queued', 'running', interval '1 minute'), ('running', NULL, interval '2 minutes')) m(f, t, o)"
                    f" WHERE {recent} AND (j.created_at > now() - interval '{EVENT_DAYS} days'"
                    " OR j.status = 'manual_review')",  # type: ignore[arg-type]
                    span,
                )
                conn.execute(
                    "INSERT INTO triage.outbox (event_id, job_id, event_type, schema_version, attempt, created_at,"
                    " published_at) SELECT gen_random_uuid(), j.id, m.t, 1, 1, j.created_at + m.o,"
                    " j.created_at + m.o FROM triage.jobs j CROSS JOIN (VALUES ('job.registered', interval '0'),"
                    " ('job.completed', interval '2 minutes')) m(t, o)"
                    f" WHERE {recent} AND j.created_at > now() - interval '{OUTBOX_DAYS} days'",  # type: ignore[arg-type]
                    span,
                )
                conn.execute(
                    "INSERT INTO triage.classifications (job_id, attempt, label, confidence, outcome,"
                    " classifier_version, latency_ms, created_at) SELECT j.id, 1, 'billing', 0.9, 'accepted',"
                    " j.classifier_version, 0.1, j.updated_at FROM triage.jobs j"
                    f" WHERE {recent} AND j.created_at > now() - interval '{EVENT_DAYS} days'",  # type: ignore[arg-type]
                    span,
                )
                conn.execute(
                    "INSERT INTO triage.document_labels (source, external_id, label, confidence, classifier_version,"
                    " content_sha256, job_id, job_created_at, updated_at) SELECT j.source, j.external_id,"
                    " 'billing', 0.9, j.classifier_version, j.content_sha256, j.id, j.created_at, j.updated_at"
                    f" FROM triage.jobs j WHERE {recent} AND j.status = 'completed'",  # type: ignore[arg-type]
                    span,
                )
                conn.execute(
                    "INSERT INTO triage.manual_review (job_id, reason, attempts, created_at) SELECT j.id,"
                    " 'inconclusive', 1, j.updated_at FROM triage.jobs j"
                    f" WHERE {recent} AND j.status = 'manual_review'",  # type: ignore[arg-type]
                    span,
                )
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


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


def _explain(engine: sa.Engine, statement: str, parameters: Any) -> list[str]:
    with engine.connect() as conn:
        rows = conn.exec_driver_sql("EXPLAIN " + statement, parameters).all()
    return [r[0].strip() for r in rows if "Scan" in r[0]][:8]


def _day(store: JobStore, size: int) -> dict[str, float]:
    """A new day's work on the ledger: register, then claim and complete, timed."""
    batch = f"growth-{size}"
    docs = new_jobs(DAY_N, prefix=batch)
    register_s, _ = timed(
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

    complete_s, done = timed(claim_complete)
    assert done == DAY_N, done
    return {"register_docs_per_s": DAY_N / register_s, "claim_complete_jobs_per_s": DAY_N / complete_s}


def _queue_ms(engine: sa.Engine, store: JobStore) -> dict[str, float]:
    service = TriageService(store, payload_base="/nonexistent", taxonomy_names=[])
    with engine.connect() as conn:
        open_reviews = conn.execute(
            sa.select(sa.func.count()).where(manual_review.c.resolved_at.is_(None))
        ).scalar_one()
        middle = tuple(
            conn.execute(
                sa.select(manual_review.c.created_at, manual_review.c.id)
                .where(manual_review.c.resolved_at.is_(None))
                .order_by(manual_review.c.created_at, manual_review.c.id)
                .offset(open_reviews // 2)
                .limit(1)
            ).one()
        )
    out = {}
    for name, after in (("head", None), ("deep", middle)):
        service.queue(QueueFilter(), limit=50, after=after)  # warm
        out[f"queue_page_{name}_ms"] = 1000 * statistics.median(
            timed(lambda a=after: service.queue(QueueFilter(), limit=50, after=a))[0] for _ in range(5)
        )
    return out


def _measure(url: DatabaseUrl, engine: sa.Engine, size: int) -> dict[str, Any]:
    store = JobStore(engine)
    figures: dict[str, Any] = _day(store, size)
    with _statements(engine) as seen:
        seconds, outcome = timed(lambda: reconcile(store, ReconcileParams(), reports_dir=None))
    figures["reconcile_seconds"] = seconds
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
            for ago in range(1, EVENT_DAYS + 1):
                past_day_partitions(conn, today - timedelta(days=ago))  # older ones were dropped
        engine = create_engine(url, pool_size=4)
        loaded = 0
        for size in targets:
            load_s = _load(url, loaded, size - DAY_N)
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
            ("register_docs_per_s", "docs/s", True),
            ("claim_complete_jobs_per_s", "jobs/s", True),
            ("reconcile_seconds", "s", False),
            ("queue_page_head_ms", "ms", False),
            ("queue_page_deep_ms", "ms", False),
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
                    details={"at": at, "baseline": base} if key == "reconcile_seconds" else {},
                )
            )
    return figures


def run() -> list[Figure]:
    return bench_growth()
