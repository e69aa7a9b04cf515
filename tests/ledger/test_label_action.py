"""The label action against a real provider on loopback and a real PostgreSQL: the order of an
edited document's labels, and a reviewer's label through the same action."""

from __future__ import annotations

import hashlib
import json
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from airflow.sdk.exceptions import AirflowException, AirflowFailException

from tests.fakes.provider import FakeProvider
from tests.ledger.test_review_operators import context, seamed
from triage.adapters.http_actions import WebhookLabelAction
from triage.contracts.events import parse_event
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Advance, ClaimedJob, ClassificationRecord, NewJob, SendToReview
from triage.operators.review import ReviewJobsOperator
from triage.pipeline.persist import PersistHandler
from triage.pipeline.publish import JsonlEventSink, publish_all
from triage.ports.label_actions import label_order
from triage.review.config import ReviewRunConfig
from triage.review.decisions import apply_review

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
VERSION = "keyword-v1"
TAXONOMY = frozenset({"billing", "shipping"})  # as the seamed review operator's


def version_of(store: JobStore, external_id: str, content: str) -> uuid.UUID:
    """Register one version of a document (an edit is new content: a new, newer job)."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    job = NewJob(
        f"tickets:{external_id}:{digest}:{VERSION}", "tickets", external_id, digest, f"file:///p/{digest}", VERSION
    )
    return store.register([job], batch_key=BATCH, step="classify", max_attempts=3).new_ids[0]


def classified(store: JobStore, labels: dict[uuid.UUID, str]) -> tuple[uuid.UUID, dict[uuid.UUID, ClaimedJob]]:
    """Classify the jobs (accepted) and hand them to persist; return them claimed at persist,
    with the claim's lease token."""
    claim = store.claim(batch_key=BATCH, step="classify", limit=len(labels), lease_seconds=60, owner="classify")
    store.record(
        claim,
        [
            Advance(j.id, j.attempt, "persist", ClassificationRecord(labels[j.id], 0.9, "accepted", VERSION))
            for j in claim.jobs
        ],
    )
    claim = store.claim(batch_key=BATCH, step="persist", limit=len(labels), lease_seconds=60, owner="persist")
    return claim.token, {j.id: j for j in claim.jobs}


def persist(store: JobStore, action: WebhookLabelAction, token: uuid.UUID, jobs: list[ClaimedJob]) -> list[Any]:
    """The persist step's handler over these jobs, then their outcomes recorded."""
    outcomes = PersistHandler(store, action).handle(jobs)
    store.record(token, outcomes)
    return outcomes


def rows(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


@pytest.fixture
def provider() -> Any:
    with FakeProvider() as p:
        yield p


@pytest.fixture
def action(provider: FakeProvider) -> Any:
    a = WebhookLabelAction(provider.url, timeout_s=5)
    yield a
    a.close()


# -- item 11: an edited document's labels reach the provider in order ---------------------------


def test_an_older_jobs_action_after_the_newer_ones_is_skipped(
    store: JobStore, provider: FakeProvider, action: WebhookLabelAction
) -> None:
    older = version_of(store, "T-7", "my parcel is late")
    newer = version_of(store, "T-7", "my parcel is late, and I want a refund")  # the ticket was edited
    token, jobs = classified(store, {older: "shipping", newer: "refund_request"})
    persist(store, action, token, [jobs[newer]])  # the newer job's persist runs first ...
    outcomes = persist(store, action, token, [jobs[older]])  # ... then the older one's (a retry, a slow worker)
    assert [type(o).__name__ for o in outcomes] == ["Complete"]  # the older job completes ...
    assert set(provider.requests) == {jobs[newer].idempotency_key}  # ... without sending its label
    assert provider.labels == {("tickets", "T-7"): (label_order(jobs[newer].created_at, newer), "refund_request")}
    assert rows(store, "SELECT label, job_id FROM triage.document_labels") == [("refund_request", newer)]
    assert rows(store, "SELECT status::text, count(*) FROM triage.jobs GROUP BY 1") == [("completed", 2)]


def test_each_action_carries_its_order_and_the_provider_keeps_the_newest(
    store: JobStore, provider: FakeProvider, action: WebhookLabelAction
) -> None:
    """Both in flight in one batch, the older sent last: neither label is recorded yet, so both
    go out, each with its job's order, and a provider that honours it keeps the newer."""
    older = version_of(store, "T-8", "first text")
    newer = version_of(store, "T-8", "second text")
    token, jobs = classified(store, {older: "shipping", newer: "billing"})
    persist(store, action, token, [jobs[newer], jobs[older]])
    sent = {key: body for key, body in provider.effects.items()}
    for job_id in (older, newer):
        job = jobs[job_id]
        assert sent[job.idempotency_key]["label_order"] == label_order(job.created_at, job_id)
        assert datetime.fromisoformat(sent[job.idempotency_key]["job_created_at"]) == job.created_at
    assert label_order(jobs[older].created_at, older) < label_order(jobs[newer].created_at, newer)
    assert provider.stale == 1
    assert provider.labels[("tickets", "T-8")][1] == "billing"
    assert rows(store, "SELECT label FROM triage.document_labels") == [("billing",)]


def test_the_order_sorts_as_the_ledger_orders_label_writes(store: JobStore) -> None:
    ids = [version_of(store, "T-9", f"text {i}") for i in range(5)]
    with store.engine.connect() as conn:
        ledger = [
            r.id
            for r in conn.execute(
                sa.text("SELECT id, created_at FROM triage.jobs WHERE id = ANY(:ids) ORDER BY created_at, id"),
                {"ids": ids},
            )
        ]
        orders = {
            r.id: label_order(r.created_at, r.id)
            for r in conn.execute(sa.text("SELECT id, created_at FROM triage.jobs WHERE id = ANY(:ids)"), {"ids": ids})
        }
    assert sorted(ids, key=orders.__getitem__) == ledger


# -- item 12: a reviewer's label reaches the provider and the consumers ------------------------


def to_review(store: JobStore, external_id: str, content: str = "hard to tell") -> uuid.UUID:
    """A job the model could not decide: in review, its model label never sent."""
    job_id = version_of(store, external_id, content)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="classify")
    model = ClassificationRecord("billing", 0.41, "inconclusive", VERSION)
    store.record(claim, [SendToReview(job_id, claim.jobs[0].attempt, "inconclusive", classification=model)])
    return job_id


def label_decision(job_ids: list[uuid.UUID], label: str = "shipping") -> ReviewRunConfig:
    return ReviewRunConfig.from_params(
        {"job_ids": [str(j) for j in job_ids], "decision": "label", "label": label, "note": "checked by hand"}
    )


def review_key(store: JobStore, job_id: uuid.UUID) -> str:
    (key,) = rows(
        store,
        "SELECT j.idempotency_key || '/review/' || r.id FROM triage.jobs j"
        " JOIN triage.manual_review r ON r.job_id = j.id WHERE j.id = :j",
        j=job_id,
    )[0]
    return str(key)


def test_a_reviewers_label_reaches_the_provider_once(
    store: JobStore, provider: FakeProvider, action: WebhookLabelAction
) -> None:
    job_id = to_review(store, "T-20")
    first = apply_review(
        store,
        [str(job_id)],
        label_decision([job_id]),
        reviewer="alice",
        taxonomy_names=TAXONOMY,
        send_label=action.send,
    )
    again = apply_review(
        store,
        [str(job_id)],
        label_decision([job_id]),
        reviewer="bob",  # a retry of the run
        taxonomy_names=TAXONOMY,
        send_label=action.send,
    )
    assert [(j.outcome, j.action) for j in first.jobs + again.jobs] == [
        ("applied", "sent"),
        ("already_applied", "sent"),
    ]
    key = review_key(store, job_id)
    assert provider.requests == {key: 2}  # asked twice, under one key ...
    assert list(provider.effects) == [key]  # ... applied once
    body = provider.effects[key]
    (created_at,) = rows(store, "SELECT created_at FROM triage.jobs WHERE id = :j", j=job_id)[0]
    assert (body["job_id"], body["external_id"], body["label"], body["classifier_version"], body["label_order"]) == (
        str(job_id),
        "T-20",
        "shipping",
        "human:alice",
        label_order(created_at, job_id),
    )
    assert provider.labels == {("tickets", "T-20"): (label_order(created_at, job_id), "shipping")}


def test_a_reviewers_label_on_an_older_job_is_not_sent_over_a_newer_label(
    store: JobStore, provider: FakeProvider, action: WebhookLabelAction
) -> None:
    older = to_review(store, "T-21", "first text")
    newer = version_of(store, "T-21", "edited text")
    token, jobs = classified(store, {newer: "billing"})
    persist(store, action, token, [jobs[newer]])
    report = apply_review(
        store, [str(older)], label_decision([older]), reviewer="alice", taxonomy_names=TAXONOMY, send_label=action.send
    )
    assert report.jobs[0].action == "skipped: a newer job's label stands for this document"
    assert list(provider.effects) == [jobs[newer].idempotency_key]
    assert rows(store, "SELECT label, job_id FROM triage.document_labels") == [("billing", newer)]


def test_a_label_the_provider_refused_keeps_its_decision_and_the_retry_sends_it(
    store: JobStore, provider: FakeProvider, action: WebhookLabelAction
) -> None:
    job_id = to_review(store, "T-22")
    provider.fail_next = 1  # the provider is briefly down: 503
    first = apply_review(
        store,
        [str(job_id)],
        label_decision([job_id]),
        reviewer="alice",
        taxonomy_names=TAXONOMY,
        send_label=action.send,
    )
    assert (first.jobs[0].outcome, first.jobs[0].status) == ("applied", "completed")  # the decision stands
    assert first.jobs[0].action == "failed: ActionFailed: HTTP 503 from the action endpoint"
    assert [j.job_id for j in first.unsent] == [str(job_id)]
    assert provider.effects == {}
    retry = apply_review(
        store,
        [str(job_id)],
        label_decision([job_id]),
        reviewer="alice",
        taxonomy_names=TAXONOMY,
        send_label=action.send,
    )
    assert (retry.jobs[0].outcome, retry.jobs[0].action, retry.unsent) == ("already_applied", "sent", ())
    assert list(provider.effects) == [review_key(store, job_id)]


def test_the_review_operator_sends_through_the_label_action_connection_and_retries_an_unsent_label(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The operator finds the provider through ``triage_label_action``, as persist does; a label
    the provider did not confirm fails the task for Airflow's retry (not without retry)."""
    monkeypatch.setenv(
        "AIRFLOW_CONN_TRIAGE_LABEL_ACTION",
        json.dumps({"conn_type": "http", "host": provider.url, "extra": {"timeout": 5}}),
    )
    ids = [to_review(store, "T-23"), to_review(store, "T-24")]
    params = {
        "job_ids": [str(i) for i in ids],
        "decision": "label",
        "label": "shipping",
        "note": None,
        "max_replays": 3,
    }
    provider.fail_next = 1
    with pytest.raises(AirflowException, match="1 reviewer labels not confirmed") as failed:
        seamed(ReviewJobsOperator, store.engine).execute(context(params))
    assert not isinstance(failed.value, AirflowFailException)  # retried by Airflow
    result = seamed(ReviewJobsOperator, store.engine).execute(context(params))  # the retry
    assert (result["already_applied"], result["labels_unsent"]) == (2, 0)
    assert sorted(provider.effects) == sorted(review_key(store, i) for i in ids)


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_published_review_events_carry_the_label_and_the_reviewer(store: JobStore, tmp_path: Path) -> None:
    labelled, rejected = to_review(store, "T-25"), to_review(store, "T-26")
    store.review.resolve_with_label(labelled, "shipping", actor="alice", taxonomy_names=TAXONOMY)
    store.review.reject(rejected, actor="bob", note="spam")
    path = tmp_path / "events.jsonl"
    publish_all(store, JsonlEventSink(path))
    events = [parse_event(line) for line in path.read_bytes().splitlines()]
    decided = {
        (e.job_id, e.event_type): e.payload
        for e in events
        if e.event_type not in ("job.registered", "job.needs_review")
    }
    assert decided == {
        (labelled, "job.completed"): {
            "resolution": "labelled",
            "label": "shipping",
            "confidence": None,
            "classifier_version": "human:alice",
            "resolved_by": "alice",
        },
        (rejected, "job.reviewed"): {"resolution": "rejected", "resolved_by": "bob"},
        (rejected, "job.failed"): {"reason": "rejected", "resolved_by": "bob"},
    }
    registered = [line for line in path.read_bytes().splitlines() if b'"job.registered"' in line]
    assert all(b'"payload"' not in line for line in registered)  # no payload: the bytes of version 1
