"""The plans of the fenced writes: the batch's rows are read once, whatever the statistics say.

A fenced write joins the batch (``json_to_recordset``, which the planner guesses at 100 rows)
to the jobs under the lease (the partial lease index, estimated from statistics that rarely
see running jobs). On a table without statistics the planner chose a nested loop that re-read
the batch's JSON once per held job: quadratic (140 ms instead of 20 for 1,000 jobs, measured).
``record`` turns nested loops off for exactly these statements; this test reads the plans.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.sql import session
from triage.jobs.sql.expressions import event_ids, rowset
from triage.jobs.sql.moves import one_transaction as M
from triage.jobs.sql.moves import worker as T
from triage.jobs.store import JobStore
from triage.jobs.store.recording import record_txn
from triage.jobs.vocabulary.models import Release

N = 500
REGISTERED = 40 * N  # at 10 * N the planner still chose well without the setting


def _nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    return [plan, *(node for child in plan.get("Plans", ()) for node in _nodes(child))]


def _explain(conn: sa.Connection, statement: Any, params: dict[str, Any]) -> list[dict[str, Any]]:
    compiled = statement.compile(dialect=conn.dialect)  # the engine's (psycopg: typed binds), on any SQLAlchemy
    cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # an open connection has its DBAPI one
    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled), compiled.construct_params(params))
    row = cursor.fetchone()
    assert row is not None
    document = row[0]
    plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
    return _nodes(plan)


FENCED: dict[str, tuple[Callable[[], Any], dict[str, object]]] = {
    "complete": (T.complete, {}),
    "advance": (T.advance, {"next_step": "persist"}),
    "retry_later": (T.retry_later, {"error_class": "timeout", "error": None, "delay_seconds": 1.0}),
    "send_to_review": (
        T.send_to_review,
        {"reason": "inconclusive", "error_class": None, "error": None, "context": "{}"},
    ),
    "fail": (T.fail, {"reason": "missing_payload", "error_class": "missing_payload", "error": None}),
    "release": (T.release, {}),
}


@pytest.mark.parametrize("name", sorted(FENCED))
def test_fenced_writes_read_the_batch_once(store: JobStore, name: str) -> None:
    store.register(new_jobs(REGISTERED), batch_key="b", step="classify", max_attempts=3)  # never analyzed
    claim = store.claim(batch_key="b", step="classify", limit=N, lease_seconds=60, owner="w")
    build, extra = FENCED[name]
    events = iter(event_ids(N))  # the completion's outbox event ids; the other statements read no such column
    held = ({"id": j.id, "attempt": j.attempt, "event_id": next(events), **extra} for j in claim.jobs)
    params = {"token": claim.token, **rowset("held", held)}
    with store.engine.connect() as conn, conn.begin() as txn:
        conn.execute(session.fenced_write_joins())
        nodes = _explain(conn, build(), params)
        txn.rollback()
    scans = [n for n in nodes if n["Node Type"] == "Function Scan"]
    assert scans, "the batch is read through json_to_recordset"
    assert all(n["Actual Loops"] == 1 for n in scans), [(n["Node Type"], n["Actual Loops"]) for n in scans]
    moved = max(n["Actual Rows"] for n in nodes if n["Node Type"] == "ModifyTable")
    assert moved == N


def test_record_leaves_the_planner_as_it_found_it(store: JobStore) -> None:
    store.register(new_jobs(3), batch_key="b", step="classify", max_attempts=3)
    claim = store.claim(batch_key="b", step="classify", limit=3, lease_seconds=60, owner="w")
    with store.transaction(None) as conn:
        record_txn(
            conn, claim.token, [Release(j.id, j.attempt) for j in claim.jobs], store.retry_policy, random.Random(1)
        )
        assert conn.execute(sa.text("SHOW enable_nestloop")).scalar() == "on"
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SHOW enable_nestloop")).scalar() == "on"


PICKED: dict[str, tuple[Callable[[], Any], dict[str, object]]] = {
    "complete_picked": (M.complete_picked, {"label": "billing", "confidence": 0.9, "classifier_version": "keyword-v1"}),
    "review_picked": (
        M.review_picked,
        {"reason": "inconclusive", "error_class": "inconclusive", "error": None, "context": "{}"},
    ),
}


@pytest.mark.parametrize("name", sorted(PICKED))
def test_a_chunks_moves_read_only_the_picked_jobs(store: JobStore, name: str) -> None:
    """A chunk's move is fenced on ``status = 'queued'``, which the rest of the day's jobs match
    too: joined to the batch by a hash, every queued job of the batch was read for each chunk
    (a cost that grew with the day). The picked jobs are reached by their ids, and the chunk's
    JSON is parsed once (the ids and the join each called ``json_to_recordset``: ~1.5 µs a job)."""
    store.register(new_jobs(REGISTERED), batch_key="b", step="classify", max_attempts=3)  # never analyzed
    build, extra = PICKED[name]
    with store.engine.connect() as conn, conn.begin() as txn:
        picked = conn.execute(
            M.pick_chunk(), {"p_batch_key": "b", "p_step": "classify", "p_classifier_version": "keyword-v1", "limit": N}
        ).all()
        events = iter(event_ids(N))
        held = ({"id": j.id.hex, "attempt": j.attempt, "event_id": next(events), **extra} for j in picked)
        nodes = _explain(conn, build(), rowset("held", held))
        txn.rollback()
    parsed = [n["Actual Loops"] for n in nodes if n["Node Type"] == "Function Scan"]
    assert parsed == [1], parsed
    # Only the key: an index of the state (jobs_open_idx's queued entries) is the rest of the day.
    indexes = [(n["Index Name"], n["Actual Rows"]) for n in nodes if "Index Name" in n]
    assert {name for name, _ in indexes} == {"jobs_pkey"}, indexes
    read = [n for n in nodes if n.get("Relation Name") == "jobs" and "Scan" in n["Node Type"]]
    assert read, [n["Node Type"] for n in nodes]
    assert max(n["Actual Rows"] for n in read) == N, [(n["Node Type"], n["Actual Rows"]) for n in read]
    moved = max(n["Actual Rows"] for n in nodes if n["Node Type"] == "ModifyTable")
    assert moved == N


# -- the content cache's entries (migration 0036) ----------------------------------------------

LLM, KEYWORD, LEARNED = "llm:m:p1:t0.0+tax-00000000", "keyword-v1+tax-00000000", "learned-000000000000"


def _classify(ledger: sa.Connection, version: str, n: int, *, input_prefix: str = "") -> None:
    """``n`` accepted answers of ``version``, each for its own input (no row-level foreign keys)."""
    ledger.execute(
        sa.text(
            "INSERT INTO triage.classifications (job_id, attempt, label, confidence, outcome, classifier_version,"
            " input_sha256) SELECT gen_random_uuid(), 1, 'billing', 0.9, 'accepted', :version,"
            " encode(sha256((:prefix || i)::bytea), 'hex') FROM generate_series(1, :n) i"
        ),
        {"version": version, "n": n, "prefix": input_prefix},
    )


def test_the_answers_index_holds_the_llms_answers_only(ledger: sa.Connection) -> None:
    """The cache reuses the llm's answers alone: a keyword or learned answer was an entry nothing
    read (~3 µs of server CPU a document, at a random place of the index)."""
    for version in (LLM, KEYWORD, LEARNED):
        _classify(ledger, version, 3, input_prefix=version)
    predicate = ledger.execute(
        sa.text("SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = CAST(:index AS regclass)"),
        {"index": "triage.classifications_answers_idx"},
    ).scalar_one()
    entries = ledger.execute(
        sa.text(f"SELECT classifier_version, count(*) FROM triage.classifications WHERE {predicate} GROUP BY 1")
    ).all()
    assert entries == [(LLM, 3)]


def test_the_caches_lookup_reads_the_answers_index(store: JobStore, ledger: sa.Connection) -> None:
    """The lookup states the index's predicate (the llm's versions), so the planner uses it: one
    probe a job, however many answers the ledger holds."""
    from triage.jobs.sql.reads import answers

    _classify(ledger, LLM, 5000)
    _classify(ledger, KEYWORD, 5000)
    ids = store.register(new_jobs(50), batch_key="b", step="classify", max_attempts=3).new_ids
    given = rowset("given", ({"id": i, "input_sha256": f"{n:064x}"} for n, i in enumerate(ids)))
    params = {**given, "classifier_version": LLM, "threshold": 0.7}
    # its IN list of decisions expands at compile time: the values go into the statement
    statement = answers.reusable_answers().params(params)
    compiled = statement.compile(dialect=ledger.dialect, compile_kwargs={"render_postcompile": True})
    cursor = ledger.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # an open connection has its DBAPI one
    cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + str(compiled), compiled.construct_params())
    row = cursor.fetchone()
    assert row is not None
    nodes = _nodes((json.loads(row[0]) if isinstance(row[0], str) else row[0])[0]["Plan"])
    used = {n.get("Index Name") for n in nodes if n.get("Relation Name") == "classifications"}
    assert "classifications_answers_idx" in used, [(n["Node Type"], n.get("Index Name")) for n in nodes]


def test_a_runs_moves_are_read_from_the_days_it_could_have_logged_them(store: JobStore) -> None:
    """``job_events`` is partitioned by day: bounded by the run's ``run_after`` (less the clock
    slack) and the statement's start, the alert's read probes only those days' partitions, not
    the days kept before nor the days made ahead (each of the batch's jobs was probed in every
    one: 1.3-1.5 s a 100,000-document run from the second day of a ledger on)."""
    from datetime import UTC, datetime, timedelta

    from tests.ledger.test_alerts import BATCH, RUN, a_run
    from triage.jobs.sql.reads import alerts

    a_run(store, review=3, completed=5)
    with store.engine.connect() as conn:
        partitions = conn.execute(
            sa.text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'triage.job_events'::regclass")
        ).scalar_one()
        today = conn.execute(sa.text("SELECT statement_timestamp()")).scalar_one()
        since = today - timedelta(hours=1)
        sent: list[tuple[str, Any]] = []

        def capture(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any, many: bool) -> None:
            if "job_events" in statement and not sent:
                sent.append((statement, parameters))

        sa.event.listen(store.engine, "before_cursor_execute", capture)
        try:
            alerts.run_moves(conn, batch_key=BATCH, run_prefix=f"classify_documents/{RUN}/", since=since)
        finally:
            sa.event.remove(store.engine, "before_cursor_execute", capture)
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # an open connection has its DBAPI one
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sent[0][0], sent[0][1])
        row = cursor.fetchone()
        assert row is not None
        document = row[0]
        plan = (json.loads(document) if isinstance(document, str) else document)[0]["Plan"]
        scanned = {n["Relation Name"] for n in _nodes(plan) if n.get("Relation Name", "").startswith("job_events")}
        bounded = alerts.run_moves(conn, batch_key=BATCH, run_prefix=f"classify_documents/{RUN}/", since=since)
        unbounded = alerts.run_moves(conn, batch_key=BATCH, run_prefix=f"classify_documents/{RUN}/")
        later = alerts.run_moves(
            conn, batch_key=BATCH, run_prefix=f"classify_documents/{RUN}/", since=datetime.now(UTC) + timedelta(hours=2)
        )

    assert partitions >= 5, "the ledger keeps days ahead and a default partition"
    # The partition holding the hour (a day's, or the legacy one up to the day after the ledger was
    # made) and, past midnight, the day's before: never the days made ahead nor the default one.
    ahead = {f"job_events_p{(since + timedelta(days=d)).astimezone(UTC):%Y%m%d}" for d in range(2, 10)}
    assert scanned, plan
    assert len(scanned) <= 2 < partitions, scanned
    assert not scanned & (ahead | {"job_events_default"}), scanned
    assert bounded == unbounded
    assert bounded.entered  # the bounded read found the run's moves
    assert not later.entered  # a bound after the moves: none of them
