"""Fuzzing the event parser: whatever arrives, ``parse_event`` returns a valid event or raises
one of its two typed errors (:class:`MalformedEvent`, :class:`UnsupportedSchemaVersion`),
never anything else."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage.contracts.events import MalformedEvent, UnsupportedSchemaVersion, WorkEvent, parse_event

TYPED = (MalformedEvent, UnsupportedSchemaVersion)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

VALID: dict[str, Any] = {
    "event_id": str(uuid.uuid4()),
    "job_id": str(uuid.uuid4()),
    "event_type": "job.completed",
    "schema_version": 1,
    "attempt": 2,
    "occurred_at": "2026-11-01T00:00:00+00:00",
    "correlation_id": "corr-1",
    "payload_ref": "file:///payloads/ab/abcd",
}

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)


def outcome(raw: Any) -> WorkEvent | type[Exception]:
    try:
        return parse_event(raw)
    except TYPED as exc:
        if not str(exc):
            raise AssertionError("a typed error without a reason a human can read") from exc
        return type(exc)


def test_a_valid_event_parses_from_text_bytes_and_dict() -> None:
    text = json.dumps(VALID)
    assert parse_event(text) == parse_event(text.encode()) == parse_event(dict(VALID))


@FUZZ
@given(st.binary(max_size=300))
def test_arbitrary_bytes_are_an_event_or_a_typed_error(raw: bytes) -> None:
    outcome(raw)


@FUZZ
@given(json_values)
def test_arbitrary_json_is_a_typed_error(value: Any) -> None:
    assert outcome(json.dumps(value)) in TYPED  # nothing but a complete object can be an event


@FUZZ
@given(field=st.sampled_from(sorted(VALID)), value=json_values)
def test_one_field_replaced_by_anything(field: str, value: Any) -> None:
    result = outcome(json.dumps({**VALID, field: value}))
    if field == "schema_version" and not (type(value) is int and value == 1):
        assert result is UnsupportedSchemaVersion  # routed, never misread as version 1
    if isinstance(result, WorkEvent):  # accepted only when the replacement is itself valid
        assert json.loads(result.model_dump_json())[field] is not None


@FUZZ
@given(field=st.sampled_from(sorted(VALID)), extra=st.text(min_size=1, max_size=10))
def test_a_missing_or_unknown_field_is_malformed(field: str, extra: str) -> None:
    missing = {k: v for k, v in VALID.items() if k != field}
    expected = UnsupportedSchemaVersion if field == "schema_version" else MalformedEvent
    assert outcome(json.dumps(missing)) is expected
    if extra not in VALID:
        assert outcome(json.dumps({**VALID, extra: 1})) is MalformedEvent


@FUZZ
@given(st.text(max_size=200))
def test_a_truncated_or_mangled_line_is_a_typed_error(suffix: str) -> None:
    line = json.dumps(VALID)
    for cut in (len(line) // 2, len(line) - 1):
        assert outcome(line[:cut]) is MalformedEvent  # a torn line
        outcome(line[:cut] + suffix)  # a torn line with anything after it: an event or a typed error


@pytest.mark.parametrize("version", [True, 1.0, "1", [1], {"v": 1}, None, 0, 2])
def test_versions_that_only_look_like_one_are_unsupported(version: Any) -> None:
    with pytest.raises(UnsupportedSchemaVersion):
        parse_event(json.dumps({**VALID, "schema_version": version}))


def test_nesting_deeper_than_the_parser_is_malformed_not_a_crash() -> None:
    with pytest.raises(MalformedEvent):
        parse_event("[" * 100_000 + "]" * 100_000)
    with pytest.raises(MalformedEvent):
        parse_event('{"a":' * 100_000 + "1" + "}" * 100_000)


def test_a_naive_timestamp_is_malformed() -> None:
    with pytest.raises(MalformedEvent, match="occurred_at"):
        parse_event(json.dumps({**VALID, "occurred_at": datetime(2026, 11, 1).isoformat()}))
    assert parse_event(json.dumps({**VALID, "occurred_at": datetime(2026, 11, 1, tzinfo=UTC).isoformat()}))
