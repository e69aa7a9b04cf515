"""A job requeued from review behaves as a fresh one and keeps its history: a new attempt
budget, no lease rescues or last error, and attempts numbered on, so every attempt keeps its
classification and its events. End to end with the model behind a real HTTP fake and the
label action calling a real provider on loopback."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.fakes.provider import FakeProvider
from tests.ledger.helpers import new_jobs
from triage.adapters.http_actions import WebhookLabelAction
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.models import RetryLater
from triage.jobs.vocabulary.states import JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.persist import PersistHandler
from triage.pipeline.retrieve import to_new_jobs
from triage.pipeline.steps import RunSettings, run_step
from triage.sources.base import SourceDocument

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def rows(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def make_due(store: JobStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'"))


def expire(store: JobStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'")
        )


def claim_one(store: JobStore, owner: str = "worker") -> Any:
    got = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner=owner)
    assert len(got.jobs) == 1
    return got


def test_a_requeued_job_gets_a_fresh_budget_and_a_short_backoff(engine: sa.Engine) -> None:
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=10, cap_seconds=1000))
    [job_id] = store.register(new_jobs(1), batch_key=BATCH, step="classify", max_attempts=2).new_ids
    for _ in range(2):  # both attempts fail transiently: the second sends it to review
        got = claim_one(store)
        store.record(got, [RetryLater(job_id, got.jobs[0].attempt, "rate_limited", "HTTP 429")])
        make_due(store)
    assert store.get_status(job_id) == JobStatus.MANUAL_REVIEW
    store.review.resolve_with_requeue(job_id, actor="alice")

    got = claim_one(store)
    assert (got.jobs[0].attempt, got.jobs[0].max_attempts, got.jobs[0].attempt_in_budget) == (3, 4, 1)
    store.record(got, [RetryLater(job_id, 3, "rate_limited", "HTTP 429")])
    # the first retry of the new budget: not the last attempt, and the first step's backoff (<= 10 s)
    [(status, wait)] = rows(
        store, "SELECT status::text, extract(epoch FROM next_attempt_at - updated_at) FROM triage.jobs"
    )
    assert status == "retryable_failed"
    assert 5 <= float(wait) <= 10
    make_due(store)
    got = claim_one(store)
    store.record(got, [RetryLater(job_id, 4, "rate_limited", "HTTP 429")])
    assert rows(store, "SELECT reason, attempts, resolved_at IS NULL FROM triage.manual_review ORDER BY id") == [
        ("retries_exhausted", 2, False),
        ("retries_exhausted", 4, True),
    ]


def test_a_requeued_job_starts_without_lease_rescues_or_last_error(store: JobStore) -> None:
    [job_id] = store.register(new_jobs(1), batch_key=BATCH, step="classify", max_attempts=5).new_ids
    for _ in range(2):  # its worker dies twice, alone: the second rescue sends it to review
        claim_one(store)
        expire(store)
        store.release_expired_leases(max_rescues=1)
        make_due(store)
    assert rows(store, "SELECT status::text, status_reason, lease_rescues FROM triage.jobs") == [
        ("manual_review", "poison", 2)
    ]
    store.review.resolve_with_requeue(job_id, actor="alice")
    assert rows(
        store,
        "SELECT status::text, lease_rescues, last_error_class, last_error, attempt, attempt_base,"
        " max_attempts FROM triage.jobs",
    ) == [("queued", 0, None, None, 2, 2, 7)]
    claim_one(store)
    expire(store)
    # Its rescues start again from 0, but it stays a suspect (claimed alone): a requeued poison
    # document that still kills its worker takes nobody with it, and is poison again at once.
    assert store.release_expired_leases(max_rescues=1).to_review == 1
    # the history stays where it was: the review row and the log
    assert rows(store, "SELECT resolution, last_error IS NOT NULL FROM triage.manual_review ORDER BY id") == [
        ("requeued", True),
        (None, True),
    ]


TAXONOMY = Taxonomy.load()


def register_document(store: JobStore, payloads: PayloadStore, version: str) -> uuid.UUID:
    payload = DocumentPayload(
        external_id="T-1",
        subject="Parcel",
        body="Where is my parcel?",
        received_at=datetime(2026, 11, 1, 9, tzinfo=UTC),
    ).to_bytes()
    new = to_new_jobs([SourceDocument("test", "T-1", payload)], payloads, version)
    [job_id] = store.register(new, batch_key=BATCH, step="classify", max_attempts=3).new_ids
    return job_id


def run(store: JobStore, handler: Any) -> None:
    run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner=f"{handler.step}-worker", lease_seconds=60))


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_requeued_twice_then_accepted_the_job_completes_with_label_action_and_history(
    store: JobStore, tmp_path: Path
) -> None:
    """Review (inconclusive), requeue, review (a label outside the taxonomy), requeue, then the
    model is sure: the label action is called, the job completes with its label, and every
    attempt keeps its classification and its events."""
    payloads = PayloadStore(tmp_path / "payloads")
    with FakeOpenAIServer() as model, FakeProvider() as provider:
        classifier = OpenAICompatibleClassifier(base_url=model.base_url, api_key=None, model="m", taxonomy=TAXONOMY)
        handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.7, 1, separate_persist=True))
        action = WebhookLabelAction(provider.url, timeout_s=5)
        try:
            job_id = register_document(store, payloads, classifier.version)
            model.enqueue(Reply.ok("shipping", 0.3), Reply.ok("parcels_please"), Reply.ok("shipping", 0.95))
            for reviewer in ("alice", "bob"):
                run(store, handler)
                assert store.get_status(job_id) == JobStatus.MANUAL_REVIEW
                store.review.resolve_with_requeue(job_id, actor=reviewer)
            run(store, handler)
            run(store, PersistHandler(store, action))
        finally:
            handler.close()
            action.close()
    [job] = rows(store, "SELECT status::text, step, attempt, attempt_base, max_attempts, replays FROM triage.jobs")
    assert job == ("completed", "persist", 4, 3, 6, 2)
    assert rows(store, "SELECT label, job_id FROM triage.document_labels") == [("shipping", job_id)]
    [(key,)] = rows(store, "SELECT idempotency_key FROM triage.jobs")
    assert provider.effects[key]["label"] == "shipping"
    assert rows(
        store, "SELECT attempt, outcome, label, rejected_reason FROM triage.classifications ORDER BY attempt"
    ) == [
        (1, "inconclusive", "shipping", None),
        (2, "rejected", None, "label_outside_taxonomy"),
        (3, "accepted", "shipping", None),
    ]
    assert rows(store, "SELECT resolution, resolved_by, attempts FROM triage.manual_review ORDER BY id") == [
        ("requeued", "alice", 1),
        ("requeued", "bob", 2),
    ]
    history = rows(
        store,
        "SELECT from_status::text, to_status::text, step, attempt, actor, reason FROM triage.job_events ORDER BY id",
    )
    w, p = "classify-worker", "persist-worker"
    assert history == [
        (None, "queued", "classify", 0, "triage", "registered"),
        ("queued", "running", "classify", 1, w, "claimed"),
        ("running", "manual_review", "classify", 1, w, "inconclusive"),
        ("manual_review", "queued", "classify", 1, "alice", "requeued"),
        ("queued", "running", "classify", 2, w, "claimed"),
        ("running", "manual_review", "classify", 2, w, "rejected_output"),
        ("manual_review", "queued", "classify", 2, "bob", "requeued"),
        ("queued", "running", "classify", 3, w, "claimed"),
        ("running", "queued", "persist", 3, w, "advanced"),
        ("queued", "running", "persist", 4, p, "claimed"),
        ("running", "completed", "persist", 4, p, "completed"),
    ]
    assert [a for (_f, _t, _s, a, _a, _r) in history] == sorted(a for (_f, _t, _s, a, _a, _r) in history)
    events = rows(store, "SELECT event_type, attempt FROM triage.outbox ORDER BY created_at, event_type")
    assert sorted(events) == [
        ("job.completed", 4),
        ("job.needs_review", 1),
        ("job.needs_review", 2),
        ("job.registered", 0),
        ("job.requeued", 1),
        ("job.requeued", 2),
    ]


@pytest.mark.parametrize("replays", [pytest.param(1, id="one-requeue"), pytest.param(3, id="three-requeues")])
def test_attempts_stay_unique_over_requeues(store: JobStore, replays: int) -> None:
    """Whatever the number of requeues, no two claims of a job share an attempt number."""
    from triage.jobs.vocabulary.models import ClassificationRecord, SendToReview

    [job_id] = store.register(new_jobs(1), batch_key=BATCH, step="classify", max_attempts=3).new_ids
    for n in range(replays + 1):
        got = claim_one(store)
        record = ClassificationRecord("billing", 0.2, "inconclusive", "keyword-v1")
        store.record(got, [SendToReview(job_id, got.jobs[0].attempt, "inconclusive", classification=record)])
        if n < replays:
            store.review.resolve_with_requeue(job_id, actor="alice", max_replays=replays)
    attempts = [a for (a,) in rows(store, "SELECT attempt FROM triage.classifications ORDER BY id")]
    assert attempts == list(range(1, replays + 2))
