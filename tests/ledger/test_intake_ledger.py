"""Intake's registration statement on the real database (:func:`triage.jobs.sql.moves.registration.accept_jobs`):
a key whose job a concurrent request committed after the statement's snapshot is answered with
that job, not lost and not registered twice."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from triage.jobs.sql.expressions import event_ids, rowset
from triage.jobs.sql.moves.registration import accept_jobs, compiled
from triage.jobs.store import JobStore
from triage.jobs.store.intake import Accepted
from triage.jobs.vocabulary.models import NewJob

KEY = "helpdesk/3:R-1/" + "a" * 64 + "/v1"


def _job(key: str = KEY) -> NewJob:
    return NewJob(key, "helpdesk", "R-1", "a" * 64, "file:///p/aa/" + "a" * 64, "v1")


@pytest.mark.own_database  # two connections, one waits on the other's row
def test_a_key_committed_by_a_concurrent_request_after_the_snapshot_answers_with_its_job(store: JobStore) -> None:
    sql, constants = compiled(accept_jobs())
    first_id, event_id = event_ids(2)
    given = rowset(
        "given",
        [
            {
                "id": first_id,
                "event_id": event_id,
                "idempotency_key": KEY,
                "source": "helpdesk",
                "external_id": "R-1",
                "content_sha256": "a" * 64,
                "payload_ref": "file:///p/aa/" + "a" * 64,
                "classifier_version": "v1",
                "correlation_id": None,
            }
        ],
    )
    params = {**constants, **given, "actor": "intake:first", "batch_key": "intake", "step": "classify"}
    answers: list[Accepted] = []
    with store.engine.connect() as first:
        first.exec_driver_sql(sql, {**params, "max_attempts": 3})  # inserted, not committed yet
        second = threading.Thread(
            target=lambda: answers.extend(
                store.intake.accept([_job()], step="classify", max_attempts=3, actor="intake:second")
            )
        )
        second.start()
        time.sleep(1.0)  # the second request's insert now waits on the first's uncommitted row
        assert second.is_alive()
        first.commit()
        second.join(30)
    [answer] = answers
    assert answer.job_id.hex == first_id
    assert answer.new is False
    assert answer.status == "queued"
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar() == 1
        assert conn.execute(sa.text("SELECT count(*) FROM triage.outbox")).scalar() == 1
        assert conn.execute(sa.text("SELECT actor FROM triage.job_events")).scalars().all() == ["intake:first"]


def test_a_batch_answers_each_distinct_key_once_in_order_with_new_and_known(store: JobStore) -> None:
    jobs = [_job(f"k/{i}") for i in range(5)]
    first = store.intake.accept(jobs[:2], step="classify", max_attempts=3, actor="intake:a")
    again = store.intake.accept([jobs[1], jobs[4], jobs[0], jobs[3]], step="classify", max_attempts=3, actor="intake:b")
    assert [(a.idempotency_key, a.new) for a in again] == [("k/1", False), ("k/4", True), ("k/0", False), ("k/3", True)]
    assert {a.idempotency_key: a.job_id for a in first} == {
        a.idempotency_key: a.job_id for a in again if a.idempotency_key in ("k/0", "k/1")
    }
    with store.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM triage.outbox")).scalar() == 4
