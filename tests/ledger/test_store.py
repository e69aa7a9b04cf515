"""The job store against a real PostgreSQL: every operation, every refusal."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.contracts.events import parse_event
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import (
    DuplicateKey,
    JobNotFound,
    LeaseExpired,
    LeaseLost,
    LedgerError,
    ReplayLimitReached,
    StaleAttempt,
    UnknownStatus,
)
from triage.jobs.vocabulary.models import (
    Advance,
    Claim,
    ClaimedJob,
    ClassificationRecord,
    Complete,
    Fail,
    LabelWrite,
    NewJob,
    Outcome,
    Release,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import JobStatus, parse_status

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def register(store: JobStore, n: int = 3, **kw: str) -> None:
    store.register(new_jobs(n, **kw), batch_key=BATCH, step="classify", max_attempts=3)


def scalar(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def claim(store: JobStore, limit: int = 10, lease: float = 60, owner: str = "worker-1") -> Claim:
    return store.claim(batch_key=BATCH, step="classify", limit=limit, lease_seconds=lease, owner=owner)


def expire(store: JobStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'")
        )


# -- registration ------------------------------------------------------------------------


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_register_is_idempotent_and_writes_one_outbox_event_per_new_job(store: JobStore) -> None:
    docs = new_jobs(5)
    first = store.register(docs + docs[:2], batch_key=BATCH, step="classify", max_attempts=3)
    assert (first.new, first.existing) == (5, 2)  # a key twice in one batch registers once
    again = store.register(docs, batch_key=BATCH, step="classify", max_attempts=3)
    assert (again.new, again.existing) == (0, 5)
    assert scalar(store, "SELECT count(*) FROM triage.jobs") == 5
    sent: list = []
    assert store.relay(sent.extend) == 5
    assert store.relay(sent.extend) == 0  # marked published: never sent twice
    events = [parse_event(e.model_dump_json()) for e in sent]
    assert {e.event_type for e in events} == {"job.registered"}
    assert {e.job_id for e in events} == set(first.new_ids)
    assert (
        scalar(store, "SELECT count(*) FROM triage.job_events WHERE from_status IS NULL AND to_status = 'queued'") == 5
    )


def test_registered_jobs_get_time_ordered_ids_and_their_id_as_correlation_id(store: JobStore) -> None:
    given = NewJob("k-given", "synthetic", "given", "h", "file:///x", "v", correlation_id="trace-1")
    result = store.register([*new_jobs(3), given], batch_key=BATCH, step="classify", max_attempts=3)
    found = rows(store, "SELECT id, correlation_id, external_id FROM triage.jobs")
    assert {r.id for r in found} == set(result.new_ids)
    assert all(r.id.version == 7 and r.id.variant == uuid.RFC_4122 for r in found)  # UUIDv7: time-ordered
    assert {r.external_id: r.correlation_id for r in found if r.correlation_id != str(r.id)} == {"given": "trace-1"}


def test_a_new_classifier_version_is_new_work(store: JobStore) -> None:
    register(store, 3, version="keyword-v1")
    result = store.register(new_jobs(3, version="keyword-v2"), batch_key=BATCH, step="classify", max_attempts=3)
    assert result.new == 3


def test_malformed_input_is_registered_straight_into_review(store: JobStore) -> None:
    bad = NewJob(
        idempotency_key="jsonl:bad-1",
        source="jsonl",
        external_id="2026-11-01/a.jsonl:3",
        content_sha256="h",
        payload_ref="file:///x",
        classifier_version="v",
        status=JobStatus.MANUAL_REVIEW,
        reason="malformed_input",
        error="invalid_json",
        review_context={"line": 3},
    )
    result = store.register([bad, *new_jobs(2)], batch_key=BATCH, step="classify", max_attempts=3)
    assert result.new == 3
    review = rows(store, "SELECT reason, error_class, context FROM triage.manual_review")
    assert [(r.reason, r.error_class, r.context) for r in review] == [
        ("malformed_input", "malformed_input", {"line": 3})
    ]
    assert store.register([bad], batch_key=BATCH, step="classify", max_attempts=3).new == 0
    assert scalar(store, "SELECT count(*) FROM triage.manual_review") == 1


def test_duplicate_key_by_ad_hoc_insert_is_a_named_error(store: JobStore) -> None:
    register(store, 1)
    with pytest.raises(DuplicateKey), store.transaction() as conn:
        conn.execute(
            sa.text(
                "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
                " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
                " SELECT idempotency_key, source, external_id, content_sha256, payload_ref, classifier_version,"
                " correlation_id, batch_key, step, 'queued', 3 FROM triage.jobs"
            )
        )


# -- claims and leases -------------------------------------------------------------------


def test_claim_counts_the_attempt_and_hands_out_a_lease(store: JobStore) -> None:
    register(store, 5)
    got = claim(store, limit=3)
    assert len(got) == 3
    assert all(j.attempt == 1 for j in got.jobs)
    assert rows(store, "SELECT DISTINCT lease_token, lease_owner FROM triage.jobs WHERE status = 'running'") == [
        (got.token, "worker-1")
    ]
    rest = claim(store, limit=10, owner="worker-2")
    assert len(rest) == 2
    assert rest.token != got.token
    assert len(claim(store)) == 0


def test_retryable_jobs_wait_for_their_time(store: JobStore) -> None:
    register(store, 1)
    got = claim(store)
    store.record(got, [RetryLater(got.jobs[0].id, 1, "timeout", delay_seconds=3600)])
    assert len(claim(store)) == 0
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() - interval '1 second'"))
    again = claim(store)
    assert [j.attempt for j in again.jobs] == [2]


def test_heartbeat_extends_and_is_fenced(store: JobStore) -> None:
    register(store, 2)
    got = claim(store, lease=5)
    before = scalar(store, "SELECT max(lease_expires_at) FROM triage.jobs")
    after = store.heartbeat(got, lease_seconds=600)
    assert after > before
    stranger = got.__class__(token=uuid.uuid4(), owner="x", expires_at=got.expires_at, jobs=got.jobs)
    with pytest.raises(LeaseLost):
        store.heartbeat(stranger, lease_seconds=600)
    expire(store)
    with pytest.raises(LeaseExpired):
        store.heartbeat(got, lease_seconds=600)


# -- outcomes ----------------------------------------------------------------------------


def test_complete_upserts_the_label_and_appends_the_event_in_one_transaction(store: JobStore) -> None:
    register(store, 2)
    got = claim(store)
    record = ClassificationRecord("billing", 0.9, "accepted", "keyword-v1", latency_ms=1.5)
    result = store.record(
        got, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "keyword-v1"), record) for j in got.jobs]
    )
    assert result.completed == 2
    assert scalar(store, "SELECT count(*) FROM triage.document_labels WHERE label = 'billing'") == 2
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == 2
    assert scalar(store, "SELECT count(*) FROM triage.classifications WHERE outcome = 'accepted'") == 2
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE lease_token IS NOT NULL") == 0


def test_a_batch_with_one_lost_job_is_rolled_back_whole(store: JobStore) -> None:
    register(store, 3)
    got = claim(store)
    outcomes = [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v")) for j in got.jobs]
    with store.engine.begin() as conn:  # somebody else moves one job on
        conn.execute(
            sa.text(
                "UPDATE triage.jobs SET status = 'manual_review', lease_owner = NULL, lease_token = NULL,"
                " lease_expires_at = NULL WHERE id = :id"
            ),
            {"id": got.jobs[1].id},
        )
    with pytest.raises(LeaseLost, match=str(got.jobs[1].id)):
        store.record(got, outcomes)
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == 0
    assert scalar(store, "SELECT count(*) FROM triage.document_labels") == 0
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == 0


def test_the_fence_names_the_job_a_later_kind_missed(store: JobStore) -> None:
    """The completions all move (their returned rows are never read), the failure misses its
    job: the error names that job, not one the completions moved, and nothing stays written."""
    register(store, 3)
    got = claim(store)
    done, lost = got.jobs[:2], got.jobs[2]
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET lease_token = gen_random_uuid() WHERE id = :id"), {"id": lost.id})
    outcomes: list[Outcome] = [
        *(Complete(j.id, j.attempt) for j in done),
        Fail(lost.id, lost.attempt, "bad", "bad", None),
    ]
    with pytest.raises(LeaseLost, match=f"job {lost.id} is running and no longer held"):
        store.record(got, outcomes)
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE status = 'running'") == 3
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == 0


@pytest.mark.parametrize(
    ("tamper", "error"),
    [
        pytest.param(lambda store, job: expire(store), LeaseExpired, id="expired"),
        pytest.param(lambda store, job: None, StaleAttempt, id="stale-attempt"),
        pytest.param(lambda store, job: None, JobNotFound, id="unknown-job"),
    ],
)
def test_fenced_writes_name_their_refusal(
    store: JobStore, tamper: Callable[[JobStore, ClaimedJob], None], error: type[LedgerError]
) -> None:
    register(store, 1)
    got = claim(store)
    job = got.jobs[0]
    tamper(store, job)
    attempt = job.attempt + (1 if error is StaleAttempt else 0)
    job_id = uuid.uuid4() if error is JobNotFound else job.id
    with pytest.raises(error):
        store.record(got, [Complete(job_id, attempt)])
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == 0


def test_retry_backoff_and_exhaustion_into_review(store: JobStore) -> None:
    register(store, 1)
    for attempt in (1, 2):
        got = claim(store)
        result = store.record(got, [RetryLater(got.jobs[0].id, attempt, "rate_limited", "429")])
        assert result.retrying == 1
        delay = scalar(store, "SELECT extract(epoch FROM next_attempt_at - updated_at) FROM triage.jobs")
        ceiling = store.retry_policy.ceiling(attempt)
        assert ceiling / 2 - 0.01 <= float(delay) <= ceiling + 0.01
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now()"))
    got = claim(store)
    assert got.jobs[0].attempt == 3
    result = store.record(got, [RetryLater(got.jobs[0].id, 3, "rate_limited", "429")])
    assert (result.exhausted, result.retrying) == (1, 0)
    review = rows(store, "SELECT reason, error_class, attempts FROM triage.manual_review WHERE resolved_at IS NULL")
    assert [tuple(r) for r in review] == [("retries_exhausted", "rate_limited", 3)]


def test_review_fail_advance_and_release(store: JobStore) -> None:
    register(store, 4)
    got = claim(store)
    a, b, c, d = got.jobs
    result = store.record(
        got,
        [
            SendToReview(
                a.id,
                a.attempt,
                "inconclusive",
                context={"confidence": 0.2},
                classification=ClassificationRecord("billing", 0.2, "inconclusive", "v"),
            ),
            Fail(b.id, b.attempt, "unsupported_schema_version", "permanent", "v9"),
            Advance(c.id, c.attempt, "persist"),
            Release(d.id, d.attempt),
        ],
    )
    assert (result.to_review, result.failed, result.advanced, result.released) == (1, 1, 1, 1)
    states: dict[uuid.UUID, str] = dict(
        row._tuple()
        for row in rows(
            store,
            "SELECT id, status::text || ':' || step || ':' || attempt || '/' || attempt_base"
            " || '-' || max_attempts FROM triage.jobs",
        )
    )
    # The advanced job keeps its attempt number and starts a fresh budget of 3 after it.
    assert states == {
        a.id: "manual_review:classify:1/0-3",
        b.id: "terminal_failed:classify:1/0-3",
        c.id: "queued:persist:1/1-4",
        d.id: "queued:classify:0/0-3",
    }
    assert scalar(store, "SELECT context->>'confidence' FROM triage.manual_review") == "0.2"


def test_an_older_job_never_overwrites_a_newer_label(store: JobStore) -> None:
    register(store, 1, version="v1")
    old = claim(store)
    register(store, 1, version="v2")  # same document, a newer classifier: a newer job
    new = claim(store)
    store.record(new, [Complete(new.jobs[0].id, 1, LabelWrite("refund_request", 0.9, "v2"))])
    store.record(old, [Complete(old.jobs[0].id, 1, LabelWrite("billing", 0.9, "v1"))])  # late, stale
    assert [tuple(r) for r in rows(store, "SELECT label, classifier_version FROM triage.document_labels")] == [
        ("refund_request", "v2")
    ]


# -- recovery ----------------------------------------------------------------------------


def test_release_expired_leases_is_fenced_and_bounded(store: JobStore) -> None:
    register(store, 3)
    got = claim(store)
    store.record(got, [Complete(got.jobs[0].id, 1)])
    expire(store)
    released = store.release_expired_leases(max_rescues=1)
    assert (released.retrying, released.to_review) == (2, 0)
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == 1
    assert store.release_expired_leases().retrying == 0  # nothing left to release
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'"))
    # The dead claim left two: neither is charged the attempt (its budget grows by one) and each
    # is now claimed alone (poison isolation); dying alone again makes it poison.
    assert rows(
        store, "SELECT attempt, max_attempts, suspect_cap FROM triage.jobs WHERE status = 'retryable_failed'"
    ) == [(1, 4, 1), (1, 4, 1)]
    for _ in range(2):
        assert len(claim(store)) == 1
        expire(store)
        assert store.release_expired_leases(max_rescues=1).to_review == 1
    reasons = {r[0] for r in rows(store, "SELECT reason FROM triage.manual_review")}
    assert reasons == {"poison"}


def test_batch_to_review_takes_unfinished_work_and_spares_live_leases(store: JobStore) -> None:
    register(store, 4)
    mine = claim(store, limit=1, owner="dag/run/classify/-1/try1")
    theirs = claim(store, limit=1, owner="dag/run/classify/0/try1")
    moved = store.send_batch_to_review(
        BATCH, reason="airflow_task_failed", error="boom", owner_prefix="dag/run/classify/-1/"
    )
    assert moved == 3
    assert store.get_status(theirs.jobs[0].id) == JobStatus.RUNNING
    assert store.get_status(mine.jobs[0].id) == JobStatus.MANUAL_REVIEW
    assert store.send_batch_to_review(BATCH, reason="airflow_task_failed", error="boom", owner_prefix="x") == 0
    assert scalar(store, "SELECT count(*) FROM triage.manual_review WHERE reason = 'airflow_task_failed'") == 3


def test_requeue_from_review_is_audited_and_bounded(store: JobStore) -> None:
    register(store, 1)
    got = claim(store)
    job_id = got.jobs[0].id
    store.record(got, [SendToReview(job_id, 1, "inconclusive")])
    assert not store.review.resolve_with_requeue(
        job_id, actor="alice", note="looks fine", max_replays=1
    ).already_applied
    assert store.get_status(job_id) == JobStatus.QUEUED
    review = rows(store, "SELECT resolution, resolved_by, note FROM triage.manual_review")
    assert [tuple(r) for r in review] == [("requeued", "alice", "looks fine")]
    assert scalar(store, "SELECT attempt FROM triage.jobs") == 1  # attempts are never renumbered
    assert (
        scalar(store, "SELECT actor FROM triage.job_events WHERE to_status = 'queued' ORDER BY id DESC LIMIT 1")
        == "alice"
    )
    assert store.review.resolve_with_requeue(job_id, actor="alice").already_applied  # a repeat changes nothing
    again = claim(store)
    assert again.jobs[0].attempt == 2
    store.record(again, [SendToReview(job_id, 2, "inconclusive")])
    with pytest.raises(ReplayLimitReached):
        store.review.resolve_with_requeue(job_id, actor="alice", max_replays=1)
    with pytest.raises(JobNotFound):
        store.review.resolve_with_requeue(uuid.uuid4(), actor="alice")


def test_unknown_status_is_a_named_error(store: JobStore) -> None:
    with pytest.raises(UnknownStatus, match="finished"):
        parse_status("finished")
    with pytest.raises(UnknownStatus), store.transaction() as conn:
        conn.execute(sa.text("SELECT 'finished'::triage.job_status"))


@pytest.mark.own_database  # a READ ONLY transaction of its own
def test_the_reading_connection_refuses_writes(store: JobStore) -> None:
    store.register(new_jobs(1), batch_key="b", step="classify", max_attempts=3)
    with store.reading() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM triage.jobs")).scalar_one() == 1
        with pytest.raises(sa.exc.DBAPIError, match="read-only transaction"):
            conn.execute(sa.text("UPDATE triage.jobs SET updated_at = now()"))
    with store.engine.connect() as conn:  # the pool's connection is writable again after it
        conn.execute(sa.text("UPDATE triage.jobs SET updated_at = now()"))
