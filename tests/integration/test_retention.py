"""Retention on a real ledger: expired rows and files go, anything open or unsent stays, and
reconciliation still agrees afterwards.

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

from tests.integration.helpers import age_rows, drop_legacy_partitions, new_jobs, past_day_partitions
from triage.database import DatabaseUrl, create_engine
from triage.jobs.models import ClassificationRecord, Complete, LabelWrite, NewJob
from triage.jobs.store import JobStore
from triage.maintenance.retention import apply_retention
from triage.payloads import PayloadStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.roles import ensure_worker_role, worker_url
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
        conn.execute(
            "UPDATE triage.outbox SET published_at = created_at WHERE job_id <> ALL(%s::uuid[])",
            ([str(i) for i in keep_unsent],),
        )


def _set_mtime(path: Path, days_ago: float) -> None:
    when = (datetime.now(UTC) - timedelta(days=days_ago)).timestamp()
    os.utime(path, (when, when))


@pytest.fixture
def app_engine(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> Iterator[sa.Engine]:
    """The DAGs' role: what ``triage_maintenance`` runs as."""
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
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
    # The log: both old days' partitions went; the open job's event moved to the default
    # partition with its id and time.
    assert kinds["job_events"].removed == 9 + 6
    assert kinds["job_events"].bytes > 0
    assert kinds["job_events"].kept_open == 1
    assert _count(engine, "SELECT count(*) FROM triage.job_events") == before_events - 15
    assert _count(engine, f"SELECT count(*) FROM triage.job_events_default WHERE job_id = '{queued[0]}'") == 1
    # The outbox: the published events went, the unsent one stays (default partition).
    assert kinds["outbox"].removed == 6 + 4
    assert kinds["outbox"].kept_open == 1
    unsent = f"SELECT count(*) FROM triage.outbox WHERE job_id = '{queued[0]}' AND published_at IS NULL"
    assert _count(engine, unsent) == 1
    assert _count(engine, "SELECT count(*) FROM triage.outbox") == 1 + 4  # and the recent jobs' 4
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
    store.reject(queued[0], actor="reviewer", note="gone")
    store.relay(lambda events: None, limit=100)
    third = apply_retention(
        app_engine,
        Retention(),
        payload_base=str(tmp_path / "payloads"),
        event_log=str(events),
        reports_dir=str(reports),
    )
    assert third.kinds["job_events"].removed == 1  # its old event; today's moves stay
    assert third.kinds["outbox"].removed == 1
    assert _count(engine, "SELECT count(*) FROM triage.job_events_default") == 0
    assert _count(engine, "SELECT count(*) FROM triage.outbox_default") == 0


def _ref(engine: sa.Engine, job_id: uuid.UUID) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(sa.text("SELECT payload_ref FROM triage.jobs WHERE id = :i"), {"i": job_id}).scalar_one()
        )


def test_the_app_role_cannot_drop_a_partition_itself(app_engine: sa.Engine) -> None:
    """Only through the functions, each by its own rule."""
    with app_engine.connect() as conn, pytest.raises(sa.exc.ProgrammingError, match=r"must be owner|permission denied"):
        conn.execute(sa.text("ALTER TABLE triage.job_events DETACH PARTITION triage.job_events_default"))


def test_a_day_partition_is_never_dropped_before_its_day_is_over(db_url: DatabaseUrl, app_engine: sa.Engine) -> None:
    """Whatever ``before`` says, the function floors it at a day ago."""
    with app_engine.begin() as conn:
        rows = conn.execute(
            sa.text("SELECT * FROM triage.drop_expired_partitions('outbox', now() + interval '30 days')")
        ).all()
    assert rows == []
    with app_engine.begin() as conn, pytest.raises(sa.exc.DBAPIError, match="only job_events and outbox"):
        conn.execute(sa.text("SELECT * FROM triage.drop_expired_partitions('jobs', now())"))
