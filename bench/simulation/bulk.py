"""A ledger's past, loaded in bulk: one statement per half-million jobs.

Each job of the simulation is one ``i``, ``1 + i // DAILY`` days old, its rows the shape of a
real job's (keys, references and hashes of the lengths retrieval writes).
"""

from __future__ import annotations

import time

import psycopg

from tests.ledger.helpers import new_jobs
from triage.database import DatabaseUrl

DAILY = 10_000
"""Documents a day: constant, so that a larger ledger is a longer history (1M: 100 days, 10M:
1,000), and each size's day of work, windows and open reviews are the same size."""
EVENT_DAYS, OUTBOX_DAYS = 30, 7  # what the default retention keeps
LOAD_CHUNK = 500_000
VERSION = new_jobs(1)[0].classifier_version

# (keys, references and hashes of the same lengths as retrieve writes).
JOB_ROWS = """
SELECT (lpad(to_hex((extract(epoch FROM t.at) * 1000)::bigint), 12, '0') || '7' || substr(t.h, 14, 3) || '8'
        || substr(t.h, 18, 15))::uuid,
       'synthetic/21:' || t.ext || '/' || t.sha || '/{version}', 'synthetic', t.ext, t.sha,
       'file:///var/lib/triage/payloads/' || substr(t.sha, 1, 2) || '/' || t.sha || '#offset=' || mod(t.i, 5000) * 451
           || '&length=451',
       '{version}', gen_random_uuid()::text, to_char(t.at, 'YYYY-MM-DD'), 'classify',
       t.status::triage.job_status, t.reason, 1, 3, t.at, t.at + interval '2 minutes'
  FROM (SELECT i, md5(i::text) AS h, encode(sha256(i::text::bytea), 'hex') AS sha,
               'syn-' || lpad(i::text, 9, '0') AS ext,
               date_trunc('day', now()) - make_interval(days => 1 + (i / {daily})::int)
                   + make_interval(secs => mod(i, {daily}) * 86000.0 / {daily}) AS at,
               -- one in a hundred goes to review: open for the last 7 days, rejected by a reviewer before that
               CASE WHEN mod(i, 100) = 7 AND i / {daily} < 7 THEN 'manual_review'
                    WHEN mod(i, 100) = 7 OR mod(i, 50) = 3 THEN 'terminal_failed'
                    ELSE 'completed' END AS status,
               CASE WHEN mod(i, 100) = 7 AND i / {daily} >= 7 THEN 'rejected' END AS reason
          FROM generate_series(%(lo)s::bigint, %(hi)s::bigint - 1) AS i) t
"""
JOB_COLUMNS = """(id, idempotency_key, source, external_id, content_sha256, payload_ref, classifier_version,
    correlation_id, batch_key, step, status, status_reason, attempt, max_attempts, created_at, updated_at)"""
LOAD_JOBS = "INSERT INTO triage.jobs " + JOB_COLUMNS + JOB_ROWS

# One statement per chunk: each table's rows come from the jobs the first INSERT returns.
LOAD_RETAINED = (
    "WITH new AS (INSERT INTO triage.jobs "
    + JOB_COLUMNS
    + JOB_ROWS
    + """
    RETURNING id, source, external_id, content_sha256, classifier_version, status, status_reason, created_at,
              updated_at),
ev AS (INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason, at)
    SELECT n.id, m.f::triage.job_status, coalesce(m.t, n.status::text)::triage.job_status, 'classify', 1,
           'bench/classify/0/try1', coalesce(m.t, n.status::text), n.created_at + m.o
      FROM new n CROSS JOIN (VALUES (NULL, 'queued', interval '0'), ('queued', 'running', interval '1 minute'),
                                    ('running', NULL, interval '2 minutes')) m(f, t, o)
     WHERE n.created_at > now() - interval '{event_days} days' OR n.status = 'manual_review'),
ob AS (INSERT INTO triage.outbox (event_id, job_id, event_type, schema_version, attempt, created_at, published_at)
    SELECT gen_random_uuid(), n.id, m.t, 1, 1, n.created_at + m.o, n.created_at + m.o
      FROM new n CROSS JOIN (VALUES ('job.registered', interval '0'), ('job.completed', interval '2 minutes')) m(t, o)
     WHERE n.created_at > now() - interval '{outbox_days} days'),
cl AS (INSERT INTO triage.classifications (job_id, attempt, label, confidence, outcome, classifier_version,
                                           latency_ms, created_at)
    SELECT n.id, 1, 'billing', 0.9, 'accepted', n.classifier_version, 0.1, n.updated_at
      FROM new n WHERE n.created_at > now() - interval '{event_days} days'),
lb AS (INSERT INTO triage.document_labels (source, external_id, label, confidence, classifier_version,
                                           content_sha256, job_id, job_created_at, updated_at)
    SELECT n.source, n.external_id, 'billing', 0.9, n.classifier_version, n.content_sha256, n.id, n.created_at,
           n.updated_at FROM new n WHERE n.status = 'completed'),
rv AS (INSERT INTO triage.manual_review (job_id, reason, attempts, created_at, resolved_at, resolution, resolved_by)
    SELECT n.id, 'inconclusive', 1, n.updated_at, r.at, r.resolution, r.who
      FROM new n CROSS JOIN LATERAL (SELECT CASE WHEN n.status_reason = 'rejected' THEN n.updated_at END AS at,
                                            CASE WHEN n.status_reason = 'rejected' THEN 'rejected' END AS resolution,
                                            CASE WHEN n.status_reason = 'rejected' THEN 'bench' END AS who) r
     WHERE n.status = 'manual_review' OR n.status_reason = 'rejected')
SELECT count(*) FROM new"""
)


HISTORY = [
    "INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason, at)"
    " SELECT j.id, m.f::triage.job_status, coalesce(m.t, j.status::text)::triage.job_status, 'classify', 1,"
    " 'bench/classify/0/try1', coalesce(m.t, j.status::text), j.created_at + m.o"
    " FROM triage.jobs j CROSS JOIN (VALUES (NULL, 'queued', interval '0'),"
    " ('queued', 'running', interval '1 minute'), ('running', NULL, interval '2 minutes')) m(f, t, o)",
    "INSERT INTO triage.outbox (event_id, job_id, event_type, schema_version, attempt, created_at, published_at)"
    " SELECT gen_random_uuid(), j.id, m.t, 1, 1, j.created_at + m.o, j.created_at + m.o FROM triage.jobs j"
    " CROSS JOIN (VALUES ('job.registered', interval '0'), ('job.completed', interval '2 minutes')) m(t, o)",
    "INSERT INTO triage.classifications (job_id, attempt, label, confidence, outcome, classifier_version,"
    " latency_ms, created_at) SELECT j.id, 1, 'billing', 0.9, 'accepted', j.classifier_version, 0.1, j.updated_at"
    " FROM triage.jobs j",
]


def publish_loaded(conn: psycopg.Connection) -> None:
    """The loaded history published: the relay's watermark (migration 0029) past its last event.
    Nothing at a revision before 0029 (its events are published by their ``published_at``)."""
    row = conn.execute("SELECT to_regclass('triage.outbox_watermark') IS NOT NULL").fetchone()
    if row and row[0]:
        conn.execute(
            "UPDATE triage.outbox_watermark SET (txid, event_id) = (SELECT txid, event_id FROM triage.outbox"
            " WHERE txid IS NOT NULL ORDER BY txid DESC, event_id DESC LIMIT 1)"
            " WHERE EXISTS (SELECT FROM triage.outbox WHERE txid IS NOT NULL)"
        )


def load_retained(url: DatabaseUrl, lo: int, hi: int) -> float:
    """Jobs ``lo``..``hi`` of the simulation (job ``i`` is ``1 + i // DAILY`` days old: a ledger
    of ``n`` jobs holds ``n / DAILY`` days), and what the default retention keeps of their rows:
    the last 30 days' transitions and classifications (and every open job's), the last 7 days'
    outbox, every label, a review row per job that went to review (open for the last 7 days,
    rejected before); seconds taken."""
    started = time.perf_counter()
    statement = LOAD_RETAINED.format(version=VERSION, daily=DAILY, event_days=EVENT_DAYS, outbox_days=OUTBOX_DAYS)
    with psycopg.connect(url.libpq(), autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")  # the triggers' log is written here
        for a in range(lo, hi, LOAD_CHUNK):
            conn.execute(statement, {"lo": a, "hi": min(hi, a + LOAD_CHUNK)})
        conn.execute("SET session_replication_role = origin")
        publish_loaded(conn)
        conn.execute("VACUUM ANALYZE")
    return time.perf_counter() - started


def load_history(conn: psycopg.Connection, n: int) -> None:
    """``n`` jobs with their whole history (no retention ever ran): three transitions, two
    outbox events, a classification each."""
    conn.execute("SET session_replication_role = replica")
    for lo in range(0, n, LOAD_CHUNK):
        conn.execute(LOAD_JOBS.format(version=VERSION, daily=DAILY), {"lo": lo, "hi": min(n, lo + LOAD_CHUNK)})
    for statement in HISTORY:
        conn.execute(statement)
    conn.execute("SET session_replication_role = origin")
    publish_loaded(conn)
    conn.execute("VACUUM ANALYZE")


# Reviewers at work: after weeks, the reviews of a day are decided (here: rejected), through the
# state machine; what stays open keeps its rows and its payload pack.
REJECT_REVIEWS = """
SET triage.actor = 'bench/reviewer';
UPDATE triage.manual_review SET resolved_at = now(), resolution = 'rejected', resolved_by = 'bench'
 WHERE resolved_at IS NULL;
UPDATE triage.jobs SET status = 'terminal_failed', status_reason = 'rejected' WHERE status = 'manual_review';
"""


def reject_reviews(conn: psycopg.Connection) -> None:
    conn.execute(REJECT_REVIEWS)
