"""The label action against a real provider on loopback and a real PostgreSQL: the order of an
edited document's labels, and a reviewer's label through the same action."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from triage.jobs.models import Advance, ClaimedJob, ClassificationRecord, NewJob
from triage.jobs.store import JobStore
from triage.pipeline.actions import WebhookLabelAction, label_order
from triage.pipeline.persist import PersistHandler

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
VERSION = "keyword-v1"


def version_of(store: JobStore, external_id: str, content: str) -> uuid.UUID:
    """Register one version of a document (an edit is new content: a new, newer job)."""
    digest = hashlib.sha256(content.encode()).hexdigest()
    job = NewJob(f"tickets:{external_id}:{digest}:{VERSION}", "tickets", external_id, digest, f"file:///p/{digest}",
                 VERSION)  # fmt: skip
    return store.register([job], batch_key=BATCH, step="classify", max_attempts=3).new_ids[0]


def classified(store: JobStore, labels: dict[uuid.UUID, str]) -> tuple[uuid.UUID, dict[uuid.UUID, ClaimedJob]]:
    """Classify the jobs (accepted) and hand them to persist; return them claimed at persist,
    with the claim's lease token."""
    claim = store.claim(batch_key=BATCH, step="classify", limit=len(labels), lease_seconds=60, owner="classify")
    store.record(claim, [Advance(j.id, j.attempt, "persist", ClassificationRecord(labels[j.id], 0.9, "accepted",
                                                                                  VERSION)) for j in claim.jobs])  # fmt: skip
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


def test_an_older_jobs_action_after_the_newer_ones_is_skipped(store: JobStore, provider: FakeProvider,
                                                              action: WebhookLabelAction) -> None:  # fmt: skip
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


def test_each_action_carries_its_order_and_the_provider_keeps_the_newest(store: JobStore, provider: FakeProvider,
                                                                         action: WebhookLabelAction) -> None:  # fmt: skip
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
        ledger = [r.id for r in conn.execute(sa.text(
            "SELECT id, created_at FROM triage.jobs WHERE id = ANY(:ids) ORDER BY created_at, id"), {"ids": ids})]  # fmt: skip
        orders = {r.id: label_order(r.created_at, r.id) for r in conn.execute(
            sa.text("SELECT id, created_at FROM triage.jobs WHERE id = ANY(:ids)"), {"ids": ids})}  # fmt: skip
    assert sorted(ids, key=orders.__getitem__) == ledger
