"""Retention on a real ledger: expired rows and files go, anything open or unsent stays (a day
holding it is kept whole), and reconciliation still agrees afterwards. Only the maintenance role
runs it, within the owner's policy, whatever its session's settings.

Jobs are moved through the ledger for real, then their rows are aged by the database's owner
(``session_replication_role = replica``: the append-only triggers stand aside for the test's
time travel, which no role of a deployment can do) into day partitions of the past.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import age_rows, drop_legacy_partitions, new_jobs, past_day_partitions
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, NewJob
from triage.maintenance.retention import apply_retention
from triage.payloads import PayloadStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.roles import ensure_worker_role, maintainer_url, worker_url
from triage.settings import Retention

VERSION = new_jobs(1)[0].classifier_version
TODAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
OLD, OLDISH = 40, 35  # days ago: both past every default retention but the open work in them


def _day(days_ago: int) -> datetime:
    return TODAY - timedelta(days=days_ago)


def _owner(url: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(url.libpq(), autocommit=True)


def _past_partitions(url: DatabaseUrl, *days_ago: int) -> None:
    with _owner(url) as conn:
        drop_legacy_partitions(conn)
        for ago in days_ago:
            past_day_partitions(conn, _day(ago))


def _age(url: DatabaseUrl, job_ids: list[uuid.UUID], days_ago: int) -> None:
    """Every row of these jobs as if written ``days_ago`` days ago (noon UTC)."""
    with _owner(url) as conn:
        age_rows(conn, _day(days_ago) + timedelta(hours=12), job_ids)


def _publish_all_but(url: DatabaseUrl, keep_unsent: list[uuid.UUID]) -> None:
    with _owner(url) as conn:
        # The watermark past every event, then the kept ones after it (written by a later transaction).
        conn.execute(
            "UPDATE triage.outbox_watermark SET (txid, event_id) ="
            " (SELECT txid, event_id FROM triage.outbox ORDER BY txid DESC, event_id DESC LIMIT 1)"
        )
        conn.execute(
            "UPDATE triage.outbox SET txid = pg_current_xact_id()::text::bigint WHERE job_id = ANY(%s::uuid[])",
            ([str(i) for i in keep_unsent],),
        )


def _set_mtime(path: Path, days_ago: float) -> None:
    when = (datetime.now(UTC) - timedelta(days=days_ago)).timestamp()
    os.utime(path, (when, when))


@pytest.fixture
def app_engine(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> Iterator[sa.Engine]:
    """The maintenance role's login: what ``triage_maintenance`` runs as (the name is history)."""
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    engine = create_engine(maintainer_url(db_url), pool_size=2)
    yield engine
    engine.dispose()


@pytest.fixture
def worker_engine(app_engine: sa.Engine, db_url: DatabaseUrl) -> Iterator[sa.Engine]:
    """The pipeline's login (``triage_worker``)."""
    engine = create_engine(worker_url(db_url), pool_size=2)
    yield engine
    engine.dispose()


def _register(store: JobStore, payloads: PayloadStore, batch: str, n: int) -> list[uuid.UUID]:
    """``n`` jobs whose payloads are one pack of ``payloads``."""
    docs = new_jobs(n, prefix=batch)
    refs = payloads.put_many([f"document {batch}-{i}".encode() for i in range(n)])
    jobs = [
        NewJob(
            idempotency_key=d.idempotency_key,
            source=d.source,
            external_id=d.external_id,
            content_sha256=sha,
            payload_ref=ref,
            classifier_version=d.classifier_version,
        )
        for d, (sha, ref) in zip(docs, refs, strict=True)
    ]
    store.register(jobs, batch_key=batch, step="classify", max_attempts=3)
    with store.engine.connect() as conn:
        return list(
            conn.execute(
                sa.text("SELECT id FROM triage.jobs WHERE batch_key = :b ORDER BY external_id"), {"b": batch}
            ).scalars()
        )


def _complete(store: JobStore, batch: str, n: int) -> None:
    claim = store.claim(
        batch_key=batch, step="classify", limit=n, lease_seconds=60, owner="t", classifier_version=VERSION
    )
    label = LabelWrite("billing", 0.9, VERSION)
    answer = ClassificationRecord("billing", 0.9, "accepted", VERSION)
    store.record(claim, [Complete(j.id, j.attempt, label, answer) for j in claim.jobs])


def _count(engine: sa.Engine, sql: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(sql)).scalar_one())


def test_retention_removes_what_expired_keeps_what_is_open_and_reconciliation_agrees(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, app_engine: sa.Engine, tmp_path: Path
) -> None:
    _past_partitions(db_url, OLD, OLDISH)
    payloads = PayloadStore(tmp_path / "payloads")
    # OLD: three jobs, all completed and published: everything of theirs may go.
    done = _register(store, payloads, "old", 3)
    _complete(store, "old", 3)
    # OLDISH: two completed, one still queued with its registration event unsent: open.
    oldish = _register(store, payloads, "oldish", 3)
    _complete(store, "oldish", 2)
    queued = [
        j for j in oldish if _count(engine, f"SELECT count(*) FROM triage.jobs WHERE id = '{j}' AND status = 'queued'")
    ]
    assert len(queued) == 1
    # Recent work: completed today, kept by every retention.
    recent = _register(store, payloads, "recent", 2)
    _complete(store, "recent", 2)
    _publish_all_but(db_url, keep_unsent=queued)
    _age(db_url, done, OLD)
    _age(db_url, oldish, OLDISH)
    for path in (tmp_path / "payloads").rglob("*"):
        if path.is_file():
            _set_mtime(path, OLD)
    recent_pack = payloads.object_path(_ref(engine, recent[0]))
    _set_mtime(recent_pack, 0)

    events = tmp_path / "events" / "outbox.jsonl"
    events.parent.mkdir()
    events.write_text('{"event_id": "live"}\n')
    old_file, new_file = (
        events.with_name("outbox.jsonl.20261001T000000Z"),
        events.with_name("outbox.jsonl.20261130T000000Z"),
    )
    for file, ago in ((old_file, 20), (new_file, 1)):
        file.write_text("{}\n")
        _set_mtime(file, ago)
    reports = tmp_path / "reports"
    reports.mkdir()
    old_page, new_page = (
        reports / "reconciliation-20261001T000000Z-run1.html",
        reports / "reconciliation-20261130T000000Z-run2.html",
    )
    for page, ago in ((old_page, 40), (new_page, 1)):
        page.write_text("<html></html>")
        _set_mtime(page, ago)
    before_events = _count(engine, "SELECT count(*) FROM triage.job_events")

    report = apply_retention(
        app_engine,
        Retention(),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(events),
        reports_dir=str(reports),
    )

    kinds = report.kinds
    # The log: OLD's day went; OLDISH's holds the open job's event, so it is kept whole.
    assert kinds["job_events"].removed == 9
    assert kinds["job_events"].bytes > 0
    assert kinds["job_events"].kept_open == 1  # one day partition
    assert _count(engine, "SELECT count(*) FROM triage.job_events") == before_events - 9
    oldish_day = f"triage.job_events_p{_day(OLDISH):%Y%m%d}"
    assert _count(engine, f"SELECT count(*) FROM {oldish_day}") == 7
    assert _count(engine, "SELECT count(*) FROM triage.job_events_default") == 0
    # The outbox: OLD's published day went; OLDISH's holds the unsent event: kept whole.
    assert kinds["outbox"].removed == 6
    assert kinds["outbox"].kept_open == 1
    unsent = f"SELECT count(*) FROM triage.outbox WHERE job_id = '{queued[0]}' AND (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)"
    assert _count(engine, unsent) == 1
    assert _count(engine, "SELECT count(*) FROM triage.outbox") == 5 + 4  # and the recent jobs' 4
    # Classifications: the five old completed jobs'; the recent ones stay.
    assert kinds["classifications"].removed == 5
    assert _count(engine, "SELECT count(*) FROM triage.classifications") == 2
    # Payloads: OLD's pack went; OLDISH's is an open job's; the recent one is recent.
    assert kinds["payloads"].removed == 1
    assert kinds["payloads"].kept_open == 1
    assert not payloads.object_path(_ref(engine, done[0])).exists()
    assert payloads.object_path(_ref(engine, queued[0])).exists()
    assert recent_pack.exists()
    # Files: the live event file rotated (kept), the old rotated one removed; the old page removed.
    assert report.rotated_event_file is not None
    assert Path(report.rotated_event_file).exists()
    assert not events.exists()
    assert not old_file.exists()
    assert new_file.exists()
    assert kinds["event_files"].removed == 1
    assert not old_page.exists()
    assert new_page.exists()
    # Jobs and labels are never removed.
    assert _count(engine, "SELECT count(*) FROM triage.jobs") == 8
    assert _count(engine, "SELECT count(*) FROM triage.document_labels") == 7

    outcome = reconcile(store, ReconcileParams(), reports_dir=None)
    findings = {f.check: f.count for result in outcome.results for f in result.findings}
    # The one open job is what the checks may name (queued for 35 days, its event unsent); nothing of what
    # retention removed makes a finished job look broken.
    assert not set(findings) & {"completed_without_event", "completed_without_label", "label_without_completed_job"}
    assert set(findings) <= {"stuck_queued", "orphaned", "outbox_lag"}, findings
    # A second run finds nothing more to remove.
    again = apply_retention(
        app_engine,
        Retention(),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(events),
        reports_dir=str(reports),
    )
    assert again.kinds["job_events"].removed == 0
    assert again.kinds["classifications"].removed == 0
    # The open job (now in review: reconciliation found it orphaned) kept its whole history.
    assert _count(engine, f"SELECT count(*) FROM triage.job_events WHERE job_id = '{queued[0]}'") == 2
    # Once it is closed (a reviewer rejects it) and its old event sent, what the default
    # partition kept for it is expired like the rest: the next run removes it.
    store.review.reject(queued[0], actor="reviewer", note="gone")
    store.relay(lambda events: None, limit=100)
    third = apply_retention(
        app_engine,
        Retention(),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(events),
        reports_dir=str(reports),
    )
    assert third.kinds["job_events"].removed == 7  # OLDISH's whole day; today's moves stay
    assert third.kinds["outbox"].removed == 5
    assert third.kinds["job_events"].kept_open == third.kinds["outbox"].kept_open == 0
    assert _count(engine, f"SELECT count(*) FROM triage.job_events WHERE job_id = '{queued[0]}'") == 2


def _ref(engine: sa.Engine, job_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(sa.text("SELECT payload_ref FROM triage.jobs WHERE id = :i"), {"i": job_id}).scalar_one()
        )


def test_the_app_role_cannot_drop_a_partition_itself(app_engine: sa.Engine) -> None:
    """Only through the functions, each by its own rule."""
    with app_engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError, match=r"must be owner|permission denied"):
        conn.execute(sa.text("ALTER TABLE triage.job_events DETACH PARTITION triage.job_events_default"))


def test_a_day_partition_is_never_dropped_within_the_policy(db_url: DatabaseUrl, app_engine: sa.Engine) -> None:
    """Whatever ``before`` says, the function removes nothing the owner's policy keeps: a day
    partition 10 days old (past the 8-day floor) stays under the 30-day policy."""
    _past_partitions(db_url, 10)
    with app_engine.begin() as conn:
        rows = conn.execute(
            sa.text("SELECT * FROM triage.drop_expired_partitions('job_events', now() + interval '30 days')")
        ).all()
    assert rows == []
    assert _partition_exists(db_url, f"job_events_p{_day(10):%Y%m%d}")
    with app_engine.begin() as conn, pytest.raises(sa.exc.DBAPIError, match="only job_events and outbox"):
        conn.execute(sa.text("SELECT * FROM triage.drop_expired_partitions('jobs', now())"))


def _partition_exists(url: DatabaseUrl, name: str) -> bool:
    with _owner(url) as conn:
        return conn.execute("SELECT to_regclass(%s) IS NOT NULL", (f"triage.{name}",)).fetchone() == (True,)


HOSTILE_SESSION = ("SET TimeZone = 'LINT+167'", "SET DateStyle = 'SQL, DMY'", "SET IntervalStyle = 'sql_standard'")


@pytest.mark.parametrize("parent", ["job_events", "outbox"])
def test_a_hostile_session_cannot_make_today_look_expired(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, app_engine: sa.Engine, parent: str
) -> None:
    """Issue #25: with ``TimeZone = 'LINT+167'`` and ``DateStyle = 'SQL'`` the bounds read back as
    text looked 181 hours older, and today's partition was dropped with the events of jobs
    completed seconds before. Now the functions pin both and read no bound as text."""
    _past_partitions(db_url, 1)  # today's, tomorrow's and yesterday's day partitions
    store.register(new_jobs(3, prefix="today"), batch_key="today", step="classify", max_attempts=3)
    _complete(store, "today", 3)
    before = _count(engine, f"SELECT count(*) FROM triage.{parent}")
    with app_engine.connect() as conn:
        for setting in HOSTILE_SESSION:
            conn.execute(sa.text(setting))
        # The shortest floor a caller could ever ask for: a day.
        rows = conn.execute(sa.text("SELECT * FROM triage.drop_expired_partitions(:p, now())"), {"p": parent}).all()
        conn.commit()
    assert [r for r in rows if r.action == "dropped"] == []
    assert _partition_exists(db_url, f"{parent}_p{TODAY:%Y%m%d}")
    assert _partition_exists(db_url, f"{parent}_p{_day(1):%Y%m%d}")
    assert _count(engine, f"SELECT count(*) FROM triage.{parent}") == before


def test_the_app_role_may_run_no_retention_function(worker_engine: sa.Engine, db_url: DatabaseUrl) -> None:
    """Issue #25: every worker and the API server logged in as a member of the app role, which
    could run the functions with a horizon and a session of its choosing."""
    _past_partitions(db_url, 1)
    calls = (
        "SELECT * FROM triage.drop_expired_partitions('job_events', now())",
        "SELECT * FROM triage.ensure_day_partitions(1)",
        "SELECT * FROM triage.purge_classifications(now(), 0, 10)",
        "SELECT triage.purge_reconciliation_runs(now())",
    )
    for call in calls:
        with worker_engine.connect() as conn:
            for setting in HOSTILE_SESSION:
                conn.execute(sa.text(setting))
            with pytest.raises(sa.exc.ProgrammingError, match="permission denied for function"):
                conn.execute(sa.text(call))
    assert _partition_exists(db_url, f"job_events_p{TODAY:%Y%m%d}")


@pytest.mark.parametrize(
    ("kind", "floor"),
    [
        pytest.param(k, Retention.FLOORS["reports" if k == "reconciliation_runs" else k], id=k)
        for k in ("job_events", "outbox", "classifications", "reconciliation_runs")
    ],
)
def test_the_policy_floors_are_enforced_by_the_database(
    db_url: DatabaseUrl, app_engine: sa.Engine, worker_engine: sa.Engine, kind: str, floor: float
) -> None:
    """The floors Python checks (:attr:`Retention.FLOORS`) are the table's CHECK; only the owner
    may change the policy at all."""
    with _owner(db_url) as conn:
        with pytest.raises(psycopg.errors.CheckViolation, match="retention_policy_floor_check"):
            conn.execute("UPDATE triage.retention_policy SET keep_days = %s WHERE kind = %s", (floor - 0.5, kind))
        conn.execute("UPDATE triage.retention_policy SET keep_days = %s WHERE kind = %s", (floor, kind))
    for role_engine in (app_engine, worker_engine):
        with role_engine.begin() as conn, pytest.raises(sa.exc.ProgrammingError, match="permission denied"):
            conn.execute(sa.text("UPDATE triage.retention_policy SET keep_days = 100 WHERE kind = :k"), {"k": kind})


def test_a_setting_shorter_than_the_policy_is_reported_not_applied(
    db_url: DatabaseUrl, app_engine: sa.Engine, tmp_path: Path
) -> None:
    report = apply_retention(
        app_engine,
        Retention(job_events=10, outbox=3),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(tmp_path / "events" / "outbox.jsonl"),
        reports_dir=str(tmp_path / "reports"),
    )
    assert "the database's retention policy keeps job_events 30 days, not 10" in report.kinds["job_events"].notes
    assert "the database's retention policy keeps outbox 7 days, not 3" in report.kinds["outbox"].notes
    assert report.kinds["classifications"].notes == []


def test_an_owner_shortened_policy_is_what_the_functions_apply(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, app_engine: sa.Engine
) -> None:
    """The horizon is the policy's: 8 days set by the owner drops a 10-day-old day; the caller's
    ``before`` (here: keep 20 days) can only keep more."""
    _past_partitions(db_url, 10)
    store.register(new_jobs(2, prefix="ten"), batch_key="ten", step="classify", max_attempts=3)
    _complete(store, "ten", 2)
    ids = list(_ids(engine, "ten"))
    _publish_all_but(db_url, keep_unsent=[])
    _age(db_url, ids, 10)
    ledger = JobStore(app_engine).retention
    assert [o.action for o in ledger.drop_expired_partitions("job_events", TODAY)] == []  # policy: 30 days
    with _owner(db_url) as conn:
        conn.execute("UPDATE triage.retention_policy SET keep_days = 8 WHERE kind = 'job_events'")
    assert ledger.policy()["job_events"] == 8
    assert [o.action for o in ledger.drop_expired_partitions("job_events", TODAY - timedelta(days=20))] == []
    dropped = ledger.drop_expired_partitions("job_events", None)
    assert [(o.partition, o.action, o.rows) for o in dropped] == [(f"job_events_p{_day(10):%Y%m%d}", "dropped", 6)]


def _ids(engine: sa.Engine, batch: str) -> list[uuid.UUID]:
    with engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM triage.jobs WHERE batch_key = :b"), {"b": batch}).scalars())


def test_a_day_kept_for_an_open_job_blocks_no_transition(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, app_engine: sa.Engine, worker_engine: sa.Engine
) -> None:
    """The check that keeps a day whole runs before any DETACH: while retention's transaction is
    still open, a worker's transition goes through at once. (Before, the open job's events were
    copied under the parent's DETACH lock, and every transition waited for the commit.)"""
    _past_partitions(db_url, OLD)
    store.register(new_jobs(1, prefix="open"), batch_key="open", step="classify", max_attempts=3)
    open_job = _ids(engine, "open")
    _age(db_url, open_job, OLD)
    store.register(new_jobs(1, prefix="now"), batch_key="now", step="classify", max_attempts=3)
    with app_engine.connect() as maintenance:
        rows = maintenance.execute(
            sa.text("SELECT partition_name, action FROM triage.drop_expired_partitions('job_events', now())")
        ).all()
        assert [tuple(r) for r in rows] == [(f"job_events_p{_day(OLD):%Y%m%d}", "kept_open")]
        # retention's transaction is still open here
        with worker_engine.connect() as worker:
            worker.execute(sa.text("SET lock_timeout = '1s'"))
            moved = worker.execute(
                sa.text(
                    "UPDATE triage.jobs SET status = 'terminal_failed', status_reason = 'x'"
                    " WHERE batch_key = 'now' RETURNING id"
                )
            ).all()
            worker.commit()
        assert len(moved) == 1
        maintenance.commit()
    assert _count(engine, f"SELECT count(*) FROM triage.job_events_p{_day(OLD):%Y%m%d}") == 1


def test_no_job_reopens_while_retention_decides_its_days(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, app_engine: sa.Engine
) -> None:
    """A replay (``terminal_failed -> queued``) is the one move that makes a closed job open
    again: while retention holds its lock (between the check of a day and its drop) the move is
    refused with a retryable error, so no day is dropped under a job that just reopened."""
    from triage.jobs.vocabulary.errors import RetentionBusy

    store.register(new_jobs(1, prefix="failed"), batch_key="failed", step="classify", max_attempts=3)
    (job_id,) = _ids(engine, "failed")
    with engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET status = 'terminal_failed' WHERE id = :i"), {"i": job_id})
    from triage.contracts.replay import ReplayFilter

    selection = ReplayFilter.parse(
        {"batch_key": "failed", "states": ["terminal_failed"], "dry_run": False, "note": "n"}
    )
    with app_engine.connect() as maintenance:
        maintenance.execute(sa.text("SELECT * FROM triage.drop_expired_partitions('job_events', now())")).all()
        with pytest.raises(RetentionBusy, match="retention is deciding"):
            store.review.replay(selection, actor="alice")
        maintenance.commit()
    assert store.review.replay(selection, actor="alice").replayed_now == 1
