"""Review decisions in the store against a real PostgreSQL: every action, every refusal."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.contracts.events import WorkEvent
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import JobNotFound, LabelNotInTaxonomy, LedgerError, NotInReview, ReplayLimitReached
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, ReviewResult, SendToReview
from triage.jobs.vocabulary.states import JobStatus

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = frozenset({"billing", "shipping", "refund_request"})


def to_review(store: JobStore, n: int = 1, *, prefix: str = "doc", version: str = "keyword-v1") -> list[uuid.UUID]:
    """Register ``n`` documents and send them to review as the model's inconclusive answers."""
    registered = store.register(
        new_jobs(n, prefix=prefix, version=version), batch_key=BATCH, step="classify", max_attempts=3
    )
    claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="worker-1")
    model = ClassificationRecord("billing", 0.41, "inconclusive", version)
    store.record(
        claim,
        [
            SendToReview(j.id, j.attempt, "inconclusive", context={"confidence": 0.41}, classification=model)
            for j in claim.jobs
        ],
    )
    return list(registered.new_ids)


def completed(store: JobStore, *, prefix: str, version: str, label: str) -> uuid.UUID:
    store.register(new_jobs(1, prefix=prefix, version=version), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-1")
    job = claim.jobs[0]
    store.record(claim, [Complete(job.id, job.attempt, LabelWrite(label, 0.9, version))])
    return job.id


def rows(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def snapshot(store: JobStore) -> dict[str, list[tuple[Any, ...]]]:
    """Everything a decision could touch, to prove that a refusal or a repeat touched nothing."""
    return {
        "jobs": rows(
            store, "SELECT id, status, status_reason, attempt, replays, updated_at FROM triage.jobs ORDER BY id"
        ),
        "events": rows(store, "SELECT id FROM triage.job_events ORDER BY id"),
        "reviews": rows(
            store,
            "SELECT id, resolution, resolved_by, resolved_at, note, context FROM triage.manual_review ORDER BY id",
        ),
        "labels": rows(
            store, "SELECT source, external_id, label, job_id, updated_at FROM triage.document_labels ORDER BY 1, 2"
        ),
        "outbox": rows(store, "SELECT event_id FROM triage.outbox ORDER BY event_id"),
        "classifications": rows(store, "SELECT id FROM triage.classifications ORDER BY id"),
    }


def label(store: JobStore, job_id: uuid.UUID, name: str = "billing", actor: str = "alice") -> ReviewResult:
    return store.review.resolve_with_label(
        job_id, name, actor=actor, note="clearly an invoice", taxonomy_names=TAXONOMY
    )


def last_event(store: JobStore, job_id: uuid.UUID) -> tuple[Any, ...]:
    return rows(
        store,
        "SELECT from_status, to_status, actor, reason FROM triage.job_events WHERE job_id = :j"
        " ORDER BY id DESC LIMIT 1",
        j=job_id,
    )[0]


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_label_completes_the_job_with_its_label_review_row_and_event(store: JobStore) -> None:
    (job_id,) = to_review(store)
    classifications_before = rows(store, "SELECT count(*) FROM triage.classifications")
    result = label(store, job_id)
    assert (result.already_applied, result.status, result.resolved_by, result.label_written) == (
        False,
        JobStatus.COMPLETED,
        "alice",
        True,
    )
    assert last_event(store, job_id) == ("manual_review", "completed", "alice", "labelled")
    assert rows(store, "SELECT label, confidence, classifier_version, job_id FROM triage.document_labels") == [
        ("billing", None, "human:alice", job_id)
    ]
    review = rows(
        store,
        "SELECT resolution, resolved_by, note, context->>'resolved_label', resolved_at IS NOT NULL"
        " FROM triage.manual_review",
    )
    assert review == [("labelled", "alice", "clearly an invoice", "billing", True)]
    assert rows(
        store,
        "SELECT event_type, payload FROM triage.outbox WHERE job_id = :j ORDER BY created_at DESC LIMIT 1",
        j=job_id,
    ) == [
        (
            "job.completed",
            {
                "resolution": "labelled",
                "label": "billing",
                "confidence": None,
                "classifier_version": "human:alice",
                "resolved_by": "alice",
            },
        )
    ]
    # the model's attempts stay the model's: no classification row for a human label
    assert rows(store, "SELECT count(*) FROM triage.classifications") == classifications_before


def test_a_reject_fails_the_job_for_good(store: JobStore) -> None:
    (job_id,) = to_review(store)
    result = store.review.reject(job_id, actor="bob", note="spam")
    assert (result.already_applied, result.status, result.resolved_by) == (False, JobStatus.TERMINAL_FAILED, "bob")
    assert last_event(store, job_id) == ("manual_review", "terminal_failed", "bob", "rejected")
    assert rows(store, "SELECT resolution, resolved_by, note FROM triage.manual_review") == [
        ("rejected", "bob", "spam")
    ]
    assert rows(
        store,
        "SELECT event_type, payload->>'resolution', payload->>'reason' FROM triage.outbox WHERE job_id = :j"
        " AND event_type NOT IN ('job.registered', 'job.needs_review') ORDER BY event_type",
        j=job_id,
    ) == [("job.failed", None, "rejected"), ("job.reviewed", "rejected", None)]
    assert rows(store, "SELECT count(*) FROM triage.document_labels") == [(0,)]


def test_a_requeue_gives_a_fresh_budget_and_counts_a_replay(store: JobStore) -> None:
    (job_id,) = to_review(store)
    result = store.review.resolve_with_requeue(job_id, actor="carol", note="model was down", max_replays=2)
    assert (result.already_applied, result.status, result.resolved_by) == (False, JobStatus.QUEUED, "carol")
    assert last_event(store, job_id) == ("manual_review", "queued", "carol", "requeued")
    # attempt 1 stays attempt 1; the next budget (3 attempts, as before) runs from 2 to 4
    assert rows(store, "SELECT attempt, attempt_base, max_attempts, replays FROM triage.jobs") == [(1, 1, 4, 1)]
    assert rows(store, "SELECT event_type FROM triage.outbox WHERE event_type = 'job.requeued'") == [("job.requeued",)]


@pytest.mark.parametrize(
    "decide",
    [
        pytest.param(lambda s, j: label(s, j), id="label"),
        pytest.param(lambda s, j: s.review.reject(j, actor="alice"), id="reject"),
        pytest.param(lambda s, j: s.review.resolve_with_requeue(j, actor="alice"), id="requeue"),
    ],
)
def test_the_same_decision_twice_changes_nothing_and_says_so(
    store: JobStore, decide: Callable[[JobStore, uuid.UUID], ReviewResult]
) -> None:
    (job_id,) = to_review(store)
    first = decide(store, job_id)
    before = snapshot(store)
    again = decide(store, job_id)
    assert again.already_applied is True
    assert (again.status, again.resolved_by, again.resolved_at) == (first.status, first.resolved_by, first.resolved_at)
    assert snapshot(store) == before


DECISIONS = {
    "label": lambda s, j: label(s, j),
    "other-label": lambda s, j: label(s, j, "shipping"),
    "reject": lambda s, j: s.review.reject(j, actor="dave"),
    "requeue": lambda s, j: s.review.resolve_with_requeue(j, actor="dave"),
}


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param("label", "other-label", id="labelled-then-another-label"),
        pytest.param("label", "reject", id="labelled-then-reject"),
        pytest.param("label", "requeue", id="labelled-then-requeue"),
        pytest.param("reject", "label", id="rejected-then-label"),
        pytest.param("reject", "requeue", id="rejected-then-requeue"),
        pytest.param("requeue", "label", id="requeued-then-label"),
        pytest.param("requeue", "reject", id="requeued-then-reject"),
    ],
)
def test_a_different_decision_on_a_resolved_job_is_refused(store: JobStore, first: str, then: str) -> None:
    (job_id,) = to_review(store)
    DECISIONS[first](store, job_id)
    before = snapshot(store)
    with pytest.raises(NotInReview, match="already resolved"):
        DECISIONS[then](store, job_id)
    assert snapshot(store) == before


@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_an_unknown_job_is_refused(store: JobStore, decision: str) -> None:
    to_review(store)
    before = snapshot(store)
    with pytest.raises(JobNotFound):
        DECISIONS[decision](store, uuid.uuid4())
    assert snapshot(store) == before


@pytest.mark.parametrize("decision", sorted(DECISIONS))
def test_a_job_never_in_review_is_refused(store: JobStore, decision: str) -> None:
    registered = store.register(new_jobs(1), batch_key=BATCH, step="classify", max_attempts=3)
    before = snapshot(store)
    with pytest.raises(NotInReview, match="is queued, not in manual_review"):
        DECISIONS[decision](store, registered.new_ids[0])
    assert snapshot(store) == before


def test_a_label_outside_the_taxonomy_is_refused(store: JobStore) -> None:
    (job_id,) = to_review(store)
    before = snapshot(store)
    with pytest.raises(LabelNotInTaxonomy, match="'spam' is not in the taxonomy"):
        label(store, job_id, "spam")
    assert snapshot(store) == before
    assert store.get_status(job_id) == JobStatus.MANUAL_REVIEW


def test_requeues_are_bounded_and_a_spent_job_stays_in_review(store: JobStore) -> None:
    (job_id,) = to_review(store)
    store.review.resolve_with_requeue(job_id, actor="alice", max_replays=1)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-2")
    store.record(claim, [SendToReview(job_id, claim.jobs[0].attempt, "inconclusive")])
    before = snapshot(store)
    with pytest.raises(ReplayLimitReached, match="requeued 1 times"):
        store.review.resolve_with_requeue(job_id, actor="alice", max_replays=1)
    assert snapshot(store) == before
    # the reviewer can still decide otherwise
    assert store.review.reject(job_id, actor="alice").status == JobStatus.TERMINAL_FAILED


def test_a_job_back_in_review_after_a_requeue_can_be_decided_again(store: JobStore) -> None:
    (job_id,) = to_review(store)
    store.review.resolve_with_requeue(job_id, actor="alice")
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="worker-2")
    store.record(claim, [SendToReview(job_id, claim.jobs[0].attempt, "inconclusive")])
    assert label(store, job_id).already_applied is False
    assert rows(store, "SELECT resolution FROM triage.manual_review ORDER BY id") == [("requeued",), ("labelled",)]


def test_a_reviewer_never_overwrites_the_label_of_a_newer_job(store: JobStore) -> None:
    """Same document, two classifier versions: the older job waits in review while the newer one
    completes. Labelling the older job completes it, but the newer label stands."""
    (old_job,) = to_review(store, prefix="doc", version="keyword-v1")
    new_job = completed(store, prefix="doc", version="keyword-v2", label="shipping")
    result = label(store, old_job)
    assert (result.status, result.label_written) == (JobStatus.COMPLETED, False)
    assert rows(store, "SELECT label, job_id FROM triage.document_labels") == [("shipping", new_job)]
    # the decision is still on record, with the label the reviewer chose
    assert rows(store, "SELECT context->>'resolved_label' FROM triage.manual_review") == [("billing",)]


def test_a_reviewer_label_on_the_newer_job_replaces_an_older_label(store: JobStore) -> None:
    completed(store, prefix="doc", version="keyword-v1", label="shipping")
    (new_job,) = to_review(store, prefix="doc", version="keyword-v2")
    assert label(store, new_job).label_written is True
    assert rows(store, "SELECT label, job_id, classifier_version FROM triage.document_labels") == [
        ("billing", new_job, "human:alice")
    ]


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_decision_events_are_valid_work_events(store: JobStore) -> None:
    ids = to_review(store, 3)
    label(store, ids[0])
    store.review.reject(ids[1], actor="alice")
    store.review.resolve_with_requeue(ids[2], actor="alice")
    sent: list[WorkEvent] = []
    store.relay(sent.extend)
    decided = sorted(e.event_type for e in sent if e.event_type not in ("job.registered", "job.needs_review"))
    # a reject is a decision (job.reviewed) and a move into terminal_failed (job.failed)
    assert decided == ["job.completed", "job.failed", "job.requeued", "job.reviewed"]
    assert sorted(e.event_type for e in sent if e.event_type == "job.needs_review") == ["job.needs_review"] * 3


@pytest.mark.own_database  # two threads race for one row's lock
def test_two_reviewers_at_once_one_decision_wins(store: JobStore) -> None:
    (job_id,) = to_review(store)
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def decide(name: str, action: str) -> None:
        barrier.wait()
        try:
            outcomes.append(DECISIONS[action](store, job_id) if action != "label" else label(store, job_id, actor=name))
        except LedgerError as exc:
            outcomes.append(exc)

    threads = [
        threading.Thread(target=decide, args=("alice", "label")),
        threading.Thread(target=decide, args=("bob", "reject")),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    applied = [o for o in outcomes if isinstance(o, ReviewResult)]
    refused = [o for o in outcomes if isinstance(o, NotInReview)]
    assert (len(applied), len(refused)) == (1, 1), outcomes
    assert rows(store, "SELECT count(*) FROM triage.manual_review WHERE resolved_at IS NOT NULL") == [(1,)]


def test_open_reviews_show_what_a_reviewer_needs_and_never_the_document(store: JobStore) -> None:
    ids = to_review(store, 2)
    cases = store.review.open_reviews()
    assert [c.job_id for c in cases] == ids
    case = cases[0]
    assert (case.reason, case.model_label, case.model_confidence, case.model_outcome) == (
        "inconclusive",
        "billing",
        0.41,
        "inconclusive",
    )
    assert case.payload_ref.startswith("file:///payloads/")
    assert [c.job_id for c in store.review.open_reviews([ids[1]])] == [ids[1]]
    label(store, ids[0])
    assert [c.job_id for c in store.review.open_reviews()] == [ids[1]]
