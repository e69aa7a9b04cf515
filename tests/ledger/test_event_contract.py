"""The event contract on a real ledger: every event type written by the statements that move
jobs, relayed, read by a consumer of version 1 as frozen (it skips the types it does not know),
and each payload valid against its published schema."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import jsonschema
import pytest

from tests.ledger.helpers import new_jobs
from tests.unit.frozen import V1_TYPES, v1_consumer
from triage.contracts.events import SCHEMA_VERSION, WorkEvent
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import (
    ClassificationRecord,
    Complete,
    Fail,
    LabelWrite,
    NewJob,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import JobStatus
from triage_tools.schemas import SCHEMAS

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = frozenset({"billing", "shipping"})


def payload_schema(event_type: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / "payloads" / f"{event_type}.v{SCHEMA_VERSION}.json").read_text(encoding="utf-8"))


def every_kind_of_event(store: JobStore) -> None:
    """Jobs that end in every state a consumer hears of; their correlation ids by external id."""
    jobs = [
        NewJob(
            idempotency_key=j.idempotency_key,
            source=j.source,
            external_id=j.external_id,
            content_sha256=j.content_sha256,
            payload_ref=j.payload_ref,
            classifier_version=j.classifier_version,
            correlation_id=f"corr-{j.external_id}",
        )
        for j in new_jobs(7)
    ]
    malformed = NewJob(
        idempotency_key="synthetic:bad:0:keyword-v1",
        source="synthetic",
        external_id="bad",
        content_sha256="0" * 64,
        payload_ref="file:///payloads/bad",
        classifier_version="keyword-v1",
        correlation_id="corr-bad",
        status=JobStatus.MANUAL_REVIEW,
        reason="malformed_input",
        error="missing body",
    )
    store.register([*jobs, malformed], batch_key=BATCH, step="classify", max_attempts=1)
    claim = store.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="worker-1")
    j = sorted(claim.jobs, key=lambda job: job.external_id)
    doubt = ClassificationRecord("billing", 0.41, "inconclusive", "keyword-v1")
    store.record(
        claim,
        [
            Complete(j[0].id, j[0].attempt, LabelWrite("billing", 0.93, "keyword-v1")),
            Complete(j[1].id, j[1].attempt),  # a completion that wrote no label
            SendToReview(j[2].id, j[2].attempt, "inconclusive", classification=doubt),
            SendToReview(j[3].id, j[3].attempt, "inconclusive", classification=doubt),
            Fail(j[4].id, j[4].attempt, "unsupported_schema", "unsupported_schema", "schema v9"),
            RetryLater(j[5].id, j[5].attempt, "timeout", "timed out"),  # its only attempt: to review
            SendToReview(j[6].id, j[6].attempt, "malformed_output", "malformed_output"),
        ],
    )
    store.review.resolve_with_label(j[2].id, "shipping", actor="alice", taxonomy_names=TAXONOMY)
    store.review.reject(j[3].id, actor="bob", note="spam")
    store.review.resolve_with_requeue(j[5].id, actor="carol")


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_v1_consumer_reads_every_event_triage_publishes_and_skips_the_new_types(store: JobStore) -> None:
    every_kind_of_event(store)
    sent: list[WorkEvent] = []
    store.relay(sent.extend)
    counts = Counter(e.event_type for e in sent)
    assert counts == {
        "job.registered": 8,
        "job.completed": 3,  # two by the step, one by a reviewer
        "job.needs_review": 5,  # malformed on arrival, two doubts, retries exhausted, malformed output
        "job.reviewed": 1,
        "job.failed": 2,  # a permanent error, a reviewer's reject
        "job.requeued": 1,
    }
    read = [v1_consumer(e.to_json()) for e in sent]
    assert all((r is None) == (e.event_type not in V1_TYPES) for r, e in zip(read, sent, strict=True))
    for event in sent:
        jsonschema.validate(event.payload or {}, payload_schema(event.event_type))
        assert event.correlation_id.startswith("corr-")


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_payloads_say_what_consumers_need(store: JobStore) -> None:
    every_kind_of_event(store)
    sent: list[WorkEvent] = []
    store.relay(sent.extend)
    by_type: dict[str, list[dict[str, Any]]] = {}
    for e in sent:
        by_type.setdefault(e.event_type, []).append(e.payload or {})
    assert sorted(by_type["job.completed"], key=str) == sorted(
        [
            {"label": "billing", "confidence": 0.93, "classifier_version": "keyword-v1"},
            {},
            {
                "label": "shipping",
                "confidence": None,
                "classifier_version": "human:alice",
                "resolution": "labelled",
                "resolved_by": "alice",
            },
        ],
        key=str,
    )
    assert by_type["job.reviewed"] == [{"resolution": "rejected", "resolved_by": "bob"}]
    assert sorted(by_type["job.failed"], key=str) == sorted(
        [
            {"reason": "unsupported_schema", "error_class": "unsupported_schema"},
            {"reason": "rejected", "resolved_by": "bob"},
        ],
        key=str,
    )
    assert by_type["job.requeued"] == [{"resolution": "requeued", "resolved_by": "carol"}]
    assert sorted(p["reason"] for p in by_type["job.needs_review"]) == sorted(
        ["malformed_input", "inconclusive", "inconclusive", "retries_exhausted", "malformed_output"]
    )
    assert {"reason": "retries_exhausted", "error_class": "timeout"} in by_type["job.needs_review"]
