"""An event's payload: an event without one is serialised exactly as version 1 always was (a
reader that predates ``payload`` still reads it), and one with a payload parses back whole."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

from triage.contracts.events import WorkEvent, parse_event

V1_FIELDS = {
    "event_id",
    "job_id",
    "event_type",
    "schema_version",
    "attempt",
    "occurred_at",
    "correlation_id",
    "payload_ref",
}


def event(payload: dict[str, object] | None) -> WorkEvent:
    return WorkEvent(
        event_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        event_type="job.completed",
        attempt=1,
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        correlation_id="c",
        payload_ref="r",
        payload=payload,
    )


def test_an_event_without_payload_has_the_fields_of_version_1_only() -> None:
    assert set(json.loads(event(None).to_json())) == V1_FIELDS


def test_a_payload_travels_and_parses_back() -> None:
    sent = event({"resolution": "labelled", "label": "billing", "resolved_by": "alice"})
    assert parse_event(sent.to_json()) == sent
