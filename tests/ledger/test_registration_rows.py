"""The rows registration writes (issue #29, retrieve's client CPU): its row sets are encoded by
msgspec (:func:`triage.jobs.store.recording.plain_rowset`), where ``json.dumps`` wrote them.
``json_to_recordset`` must read both alike: the same jobs, log, outbox and review rows for ids
holding SQL, quoting, control characters and text beyond ASCII, queued and malformed on arrival;
and a lone surrogate, which PostgreSQL text cannot hold, refused by the server as before.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.sql.expressions import rowset
from triage.jobs.store import JobStore, recording
from triage.jobs.store.recording import register_txn
from triage.jobs.vocabulary.models import NewJob
from triage.jobs.vocabulary.states import JobStatus

ODD = [
    "'; DROP TABLE triage.jobs; --",
    "$tag$ \\ back\\slash \\' \\\\ %s %(id)s :id ?",
    'quote " double; -- comment /* block */',
    "ctl\x01\x02\x1b[31m\x7f",
    "tab\there\nnew line\rreturn\r\nboth",
    "unicode\u2028line\u2029para\u0085nel\ufeffbom « ü »",
    "emoji \U0001f4a5 and rtl \u202eevil",
]

# Each row of the registered jobs as JSON, less what two registrations draw afresh: the job's id
# (and the correlation id made of it), the event's id, the log row's serial id.
SNAPSHOT = {
    "jobs": "SELECT to_jsonb(t) - 'id' - 'correlation_id' FROM triage.jobs t WHERE batch_key = 'odd'"
    " ORDER BY external_id",
    "job_events": "SELECT to_jsonb(e) - 'id' - 'job_id' FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
    " WHERE j.batch_key = 'odd' ORDER BY j.external_id, e.id",
    "outbox": "SELECT to_jsonb(o) - 'event_id' - 'job_id' - 'correlation_id' FROM triage.outbox o"
    " JOIN triage.jobs j ON j.id = o.job_id WHERE j.batch_key = 'odd' ORDER BY j.external_id",
    "manual_review": "SELECT to_jsonb(r) - 'id' - 'job_id' FROM triage.manual_review r"
    " JOIN triage.jobs j ON j.id = r.job_id WHERE j.batch_key = 'odd' ORDER BY j.external_id",
}


def odd_jobs() -> list[NewJob]:
    jobs = [dataclasses.replace(j, external_id=odd) for j, odd in zip(new_jobs(len(ODD)), ODD, strict=True)]
    malformed = dataclasses.replace(
        new_jobs(1, prefix="bad")[0],
        status=JobStatus.MANUAL_REVIEW,
        reason="malformed_input",
        error='invalid_json: « ü » \\ "',
        review_context={"external_id": "bad-0", "malformed_reason": "invalid_json"},
    )
    return [*jobs, malformed]


def registered(conn: sa.Connection, jobs: list[NewJob]) -> dict[str, list[Any]]:
    """What registering ``jobs`` writes, read back; then undone (a savepoint)."""
    with conn.begin_nested() as nested:
        done = register_txn(conn, jobs, batch_key="odd", step="classify", max_attempts=3)
        assert done.new == len(jobs)
        found = {table: [r[0] for r in conn.execute(sa.text(sql))] for table, sql in SNAPSHOT.items()}
        nested.rollback()
    return found


def test_registration_writes_the_rows_json_dumps_wrote(
    store: JobStore, ledger: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    jobs = odd_jobs()
    now = registered(ledger, jobs)
    with monkeypatch.context() as before:  # the encoding before issue #29's cut
        before.setattr(recording, "plain_rowset", rowset)
        then = registered(ledger, jobs)
    assert now == then
    assert sorted(r["external_id"] for r in now["jobs"]) == sorted([*ODD, "bad-0"])
    assert [r["last_error"] for r in now["manual_review"]] == ['invalid_json: « ü » \\ "']
    assert len(now["outbox"]) == len(jobs) + 1, "the malformed one has its needs_review event too"


def test_a_lone_surrogate_in_an_id_is_refused_by_the_server_as_before(ledger: sa.Connection) -> None:
    job = dataclasses.replace(new_jobs(1)[0], external_id="half \ud800 pair")
    with pytest.raises(sa.exc.DataError, match="surrogate"), ledger.begin_nested():
        register_txn(ledger, [job], batch_key="odd", step="classify", max_attempts=3)
