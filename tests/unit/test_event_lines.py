"""The JSON-lines sink serialises a batch in one call (:func:`triage.pipeline.publish.event_lines`):
its bytes must be exactly the lines the sink wrote before, one :meth:`WorkEvent.to_json` each,
whatever the events hold (the event schema is what consumers read)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from triage.contracts.events import WorkEvent
from triage.jobs.store.relay import RelayedEvents
from triage.pipeline.publish import event_lines, event_texts


def event(payload: dict[str, Any] | None = None, **fields: Any) -> WorkEvent:
    values: dict[str, Any] = {
        "event_id": uuid.uuid4(),
        "job_id": uuid.uuid4(),
        "event_type": "job.completed",
        "attempt": 1,
        "occurred_at": datetime(2026, 12, 5, 12, 53, 0, 123400, tzinfo=UTC),
        "correlation_id": "corr-1",
        "payload_ref": "sha256:" + "a" * 64,
        "payload": payload,
    }
    values.update(fields)
    return WorkEvent(**values)


def one_by_one(events: list[WorkEvent]) -> bytes:
    """What the sink wrote before: each event's own serialisation and a newline."""
    return b"".join(e.to_json() + b"\n" for e in events)


BATCHES = [
    pytest.param([], id="empty"),
    pytest.param([event()], id="one"),
    pytest.param([event(), event({"label": "billing", "confidence": 0.9}), event()], id="with-and-without-payload"),
    pytest.param(
        [
            event({"label": "facturação ✓", "confidence": 1e-05, "n": 1.0, "big": 10**20}),
            event(
                correlation_id='quote " and \\ backslash },{"event_id":"', occurred_at=datetime(2026, 1, 1, tzinfo=UTC)
            ),
            event(occurred_at=datetime(2026, 1, 1, 1, tzinfo=timezone(timedelta(hours=1)))),
            event({"control": "\x00\x1f\n\t", "nested": {"a": [1, {"b": None}]}}, attempt=0),
        ],
        id="odd-values",
    ),
    # A payload holding the boundary itself: the one-call split would find one too many, so
    # each event is serialised alone (the fallback), still the same bytes.
    pytest.param([event({"items": [{"x": 1}, {"event_id": "x"}]}), event()], id="boundary-inside-a-payload"),
]


@pytest.mark.parametrize("events", BATCHES)
def test_event_lines_are_the_events_own_json_byte_for_byte(events: list[WorkEvent]) -> None:
    assert event_lines(events) == one_by_one(events)


@pytest.mark.parametrize("events", BATCHES)
def test_both_sinks_send_each_event_s_own_json_relayed_or_not(events: list[WorkEvent]) -> None:
    """What the JSON-lines and the webhook sink send (:func:`event_texts`): each event's id and
    ``to_json``, from models and from a relayed batch alike."""
    own = ([str(e.event_id) for e in events], [e.to_json().decode() for e in events])
    assert event_texts(events) == own
    assert event_texts(RelayedEvents([e.to_json().decode() for e in events])) == own


def test_many_events_in_one_call() -> None:
    events = [event({"label": "x", "confidence": i / 5000}) if i % 2 else event() for i in range(5000)]
    lines = event_lines(events)
    assert lines == one_by_one(events)
    assert lines.count(b"\n") == 5000
