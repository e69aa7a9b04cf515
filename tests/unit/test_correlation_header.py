"""How a correlation id leaves Triage in a header (the model call, the label action), and how a
reader routes an event type it does not know."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from triage.contracts.events import MalformedEvent, UnknownEventType, parse_event
from triage.tracing import correlation_header


@pytest.mark.parametrize(
    ("given_id", "sent"),
    [
        pytest.param("01a231a8-f2c4-74de-b83a-a4a53f41249c", "01a231a8-f2c4-74de-b83a-a4a53f41249c", id="a job id"),
        pytest.param("crm:ticket/4711#retry=2", "crm:ticket/4711#retry=2", id="visible ascii"),
        pytest.param("x" * 128, "x" * 128, id="128 characters"),
    ],
)
def test_a_header_safe_id_is_sent_as_it_is(given_id: str, sent: str) -> None:
    assert correlation_header(given_id) == sent


@pytest.mark.parametrize(
    "given_id",
    [
        pytest.param("a b", id="space"),
        pytest.param("id\r\nX-Injected: 1", id="header injection"),
        pytest.param("café", id="non-ascii"),
        pytest.param("x" * 129, id="too long"),
        pytest.param("\ud800", id="lone surrogate"),
    ],
)
def test_any_other_id_is_sent_as_its_digest(given_id: str) -> None:
    sent = correlation_header(given_id)
    assert sent.startswith("sha256:")
    assert len(sent) == len("sha256:") + 32
    assert correlation_header(given_id) == sent  # stable: the same id, the same header


@given(st.text(max_size=300))
def test_whatever_the_id_the_header_is_valid(given_id: str) -> None:
    sent = correlation_header(given_id)
    request = httpx.Request("POST", "http://127.0.0.1/", headers={"X-Correlation-ID": sent})
    assert request.headers["x-correlation-id"] == sent
    assert "\n" not in sent
    assert "\r" not in sent


def test_an_unknown_event_type_is_routed_not_misread() -> None:
    event = {
        "event_id": "0b7c1a5e-1d2e-4f00-9a4b-6a1e2b3c4d5e",
        "job_id": "0b7c1a5e-1d2e-4f00-9a4b-6a1e2b3c4d5f",
        "event_type": "job.archived",
        "schema_version": 1,
        "attempt": 1,
        "occurred_at": "2026-11-01T00:00:00+00:00",
        "correlation_id": "c",
        "payload_ref": "p",
    }
    with pytest.raises(UnknownEventType) as raised:
        parse_event(json.dumps(event))
    assert raised.value.event_type == "job.archived"
    assert isinstance(raised.value, MalformedEvent)  # readers that catch MalformedEvent still skip it
    assert parse_event(json.dumps({**event, "event_type": "job.failed"})).event_type == "job.failed"
