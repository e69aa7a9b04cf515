"""A job whose worker died mid-attempt (its lease expired) is recovered exactly once by
reconciliation, and then completes normally."""

from __future__ import annotations

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

BATCH = "2026-11-03T00:00:00+00:00/2026-11-04T00:00:00+00:00"


def q(store: JobStore, sql: str, **params: object) -> object:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def test_a_dead_workers_job_is_rescued_once_and_then_completes(store: JobStore) -> None:
    store.register(new_jobs(1, prefix="crash"), batch_key=BATCH, step="classify", max_attempts=3)
    dead = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-that-died")
    job = dead.jobs[0]
    with store.engine.begin() as conn:  # the worker was SIGKILLed: nobody heartbeats, the lease runs out
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE id = :j"), {"j": job.id}
        )

    first = reconcile(store, ReconcileParams())
    second = reconcile(store, ReconcileParams())

    assert [r["action"] for r in first.summary["repairs"]] == ["lease_released"]
    assert second.summary["repairs"] == []
    rescues = q(
        store,
        "SELECT count(*) FROM triage.job_events WHERE job_id = :j AND from_status = 'running'"
        " AND to_status = 'retryable_failed' AND actor = 'reconciliation'",
        j=job.id,
    )
    assert rescues == 1
    assert q(store, "SELECT lease_rescues FROM triage.jobs WHERE id = :j", j=job.id) == 1

    retry = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-2")
    assert [j.id for j in retry.jobs] == [job.id]
    assert retry.jobs[0].attempt == 2  # the dead attempt counted
    store.record(retry, [Complete(job.id, 2, LabelWrite("billing", 0.93, "keyword-v1"))])

    assert q(store, "SELECT status FROM triage.jobs WHERE id = :j", j=job.id) == "completed"
    assert q(store, "SELECT job_id FROM triage.document_labels") == job.id
    assert (
        q(store, "SELECT count(*) FROM triage.outbox WHERE job_id = :j AND event_type = 'job.completed'", j=job.id) == 1
    )
    third = reconcile(store, ReconcileParams(grace_seconds=0))
    assert third.summary["repairs"] == []
    assert third.summary["conflicts"] == []
