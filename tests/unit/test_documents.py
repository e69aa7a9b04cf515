"""The document payload contract: canonical bytes, strict decoding, typed refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

import triage
from tests.strategies import OUT_OF_RANGE_TIMESTAMPS, timestamps
from triage.contracts.documents import MALFORMED_REASONS, DocumentPayload, MalformedDocument
from triage.contracts.drill import DrillSettings, drill_fraction

RECEIVED = datetime(2026, 11, 1, 9, 30, tzinfo=UTC)


def payload(**overrides: Any) -> DocumentPayload:
    fields: dict[str, Any] = {
        "external_id": "T-1",
        "subject": "Charged twice",
        "body": "Hello, I was charged twice.",
        "received_at": RECEIVED,
        "channel": "email",
    }
    fields.update(overrides)
    return DocumentPayload(**fields)


def valid_json(**overrides: Any) -> dict[str, object]:
    data: dict[str, object] = {
        "schema_version": 1,
        "external_id": "T-1",
        "subject": "s",
        "body": "b",
        "received_at": "2026-11-01T09:30:00+01:00",
        "channel": None,
    }
    data.update(overrides)
    return data


def test_to_bytes_is_canonical_json() -> None:
    data = payload(subject="Café ☕").to_bytes()

    assert data == (
        b'{"body":"Hello, I was charged twice.","channel":"email","external_id":"T-1",'
        b'"received_at":"2026-11-01T09:30:00Z","schema_version":1,"subject":"Caf\xc3\xa9 \xe2\x98\x95"}'
    )


def test_text_joins_subject_and_body() -> None:
    assert payload(subject="S", body="B").text == "S\n\nB"


def test_received_at_is_normalised_to_utc() -> None:
    local = payload(received_at=datetime(2026, 11, 1, 14, 30, 0, 5, tzinfo=timezone(timedelta(hours=5))))

    assert local.received_at.utcoffset() == timedelta(0)
    assert local.to_bytes() == payload(received_at=datetime(2026, 11, 1, 9, 30, 0, 5, tzinfo=UTC)).to_bytes()
    assert b'"received_at":"2026-11-01T09:30:00.000005Z"' in local.to_bytes()
    assert DocumentPayload.from_bytes(local.to_bytes()) == local


def test_key_order_and_spacing_do_not_matter_when_reading() -> None:
    scrambled = json.dumps(dict(reversed(valid_json().items())), indent=2).encode()

    assert DocumentPayload.from_bytes(scrambled).external_id == "T-1"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"\xff\xfe{}", "invalid_utf8", id="invalid-utf8"),
        pytest.param(b'{"external_id": ', "invalid_json", id="truncated-json"),
        pytest.param(b"", "invalid_json", id="empty"),
        pytest.param(b"[1, 2]", "schema_mismatch", id="array"),
        pytest.param(b"null", "schema_mismatch", id="null"),
        pytest.param(json.dumps(valid_json(schema_version=2)).encode(), "unsupported_schema_version", id="v2"),
        pytest.param(
            json.dumps(valid_json(schema_version=2, extra_field=1)).encode(),
            "unsupported_schema_version",
            id="v2-with-other-changes",
        ),
        pytest.param(json.dumps(valid_json(schema_version="1")).encode(), "unsupported_schema_version", id="v-string"),
        pytest.param(json.dumps(valid_json(external_id="")).encode(), "schema_mismatch", id="empty-id"),
        pytest.param(json.dumps(valid_json(external_id="   ")).encode(), "schema_mismatch", id="blank-id"),
        pytest.param(json.dumps(valid_json(external_id="x" * 513)).encode(), "schema_mismatch", id="id-too-long"),
        pytest.param(json.dumps(valid_json(external_id=7)).encode(), "schema_mismatch", id="id-not-string"),
        pytest.param(json.dumps(valid_json(received_at="2026-11-01T09:30:00")).encode(), "schema_mismatch", id="naive"),
        pytest.param(json.dumps(valid_json(received_at="yesterday")).encode(), "schema_mismatch", id="bad-timestamp"),
        pytest.param(json.dumps(valid_json(label="billing")).encode(), "schema_mismatch", id="extra-field"),
        pytest.param(
            json.dumps({k: v for k, v in valid_json().items() if k != "body"}).encode(),
            "schema_mismatch",
            id="missing-body",
        ),
        pytest.param(b'{"external_id": "\\ud800"}', "invalid_json", id="lone-surrogate"),
    ],
)
def test_from_bytes_refuses_with_a_reason(data: bytes, reason: str) -> None:
    with pytest.raises(MalformedDocument) as caught:
        DocumentPayload.from_bytes(data)

    assert caught.value.reason == reason
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize("received_at", OUT_OF_RANGE_TIMESTAMPS)
def test_a_received_at_outside_the_utc_calendar_is_a_schema_mismatch(received_at: str) -> None:
    # 0001-01-01T00:00:00+14:00 used to raise OverflowError, which from_bytes promises never to do.
    with pytest.raises(MalformedDocument) as caught:
        DocumentPayload.from_bytes(json.dumps(valid_json(received_at=received_at)).encode())

    assert caught.value.reason == "schema_mismatch"


@pytest.mark.parametrize(
    "received_at",
    [
        pytest.param(datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))), id="before-year-1"),
        pytest.param(datetime(9999, 12, 31, 23, 59, tzinfo=timezone(-timedelta(hours=14))), id="after-year-9999"),
    ],
)
def test_a_python_built_payload_outside_the_utc_calendar_is_a_validation_error(received_at: datetime) -> None:
    with pytest.raises(ValidationError, match="outside the years 1-9999"):
        payload(received_at=received_at)


@settings(max_examples=300)
@given(received_at=timestamps)
def test_from_bytes_on_any_timestamp_decodes_or_refuses_with_a_reason(received_at: str) -> None:
    result = decode_or_reason(json.dumps(valid_json(received_at=received_at)).encode())

    if isinstance(result, str):
        assert result == "schema_mismatch"
    else:
        assert result.received_at.utcoffset() == timedelta(0)
        assert DocumentPayload.from_bytes(result.to_bytes()) == result


def test_external_id_limits_are_inclusive() -> None:
    assert payload(external_id="x" * 512).external_id == "x" * 512
    with pytest.raises(ValidationError):
        payload(external_id="x" * 513)


def test_python_built_payload_refuses_lone_surrogates() -> None:
    with pytest.raises(ValidationError):
        payload(body="\ud800")


def test_payload_is_frozen() -> None:
    with pytest.raises(ValidationError):
        payload().subject = "changed"


def decode_or_reason(data: bytes) -> DocumentPayload | str:
    try:
        return DocumentPayload.from_bytes(data)
    except MalformedDocument as exc:
        return exc.reason


@settings(max_examples=500)
@given(st.binary(max_size=300))
def test_from_bytes_on_arbitrary_bytes_only_raises_malformed(data: bytes) -> None:
    result = decode_or_reason(data)  # any other exception fails the test

    if isinstance(result, str):
        assert result in MALFORMED_REASONS
    else:
        assert DocumentPayload.from_bytes(result.to_bytes()) == result


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=10), children, max_size=3),
    max_leaves=10,
)


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "schema_version": _json_values,
            "external_id": st.text(max_size=20) | _json_values,
            "subject": st.text(max_size=20) | _json_values,
            "body": st.text(max_size=20) | _json_values,
            "received_at": st.sampled_from(["2026-11-01T00:00:00Z", "2026-11-01T00:00:00", "x"])
            | timestamps
            | _json_values,
            "channel": _json_values,
            "other": _json_values,
        },
    )
)
def test_from_bytes_on_json_objects_only_raises_malformed(data: dict[str, object]) -> None:
    result = decode_or_reason(json.dumps(data).encode())

    assert isinstance(result, DocumentPayload) or result in MALFORMED_REASONS


@settings(max_examples=200)
@given(
    external_id=st.text(min_size=1, max_size=40).filter(str.strip),
    subject=st.text(max_size=60),
    body=st.text(max_size=200),
    received_at=st.datetimes(timezones=st.timezones()),
    channel=st.none() | st.text(max_size=10),
)
def test_any_valid_payload_round_trips_canonically(
    external_id: str, subject: str, body: str, received_at: datetime, channel: str | None
) -> None:
    try:
        original = DocumentPayload(
            external_id=external_id, subject=subject, body=body, received_at=received_at, channel=channel
        )
    except ValidationError:
        return  # lone surrogates from st.text(); refused at construction, as tested above
    data = original.to_bytes()

    assert DocumentPayload.from_bytes(data) == original
    assert DocumentPayload.from_bytes(data).to_bytes() == data


# -- drill settings and the drill coin ---------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        pytest.param({"transient_error_rate": 1.5}, id="rate-above-one"),
        pytest.param({"duplicate_rate": -0.1}, id="negative-rate"),
        pytest.param({"transient_error_rate": 0.5, "permanent_error_rate": 0.4, "inconclusive_rate": 0.2}, id="sum"),
        pytest.param({"surprise": 1}, id="extra-field"),
    ],
)
def test_drill_settings_refuse(fields: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        DrillSettings.model_validate(fields)


def test_drill_settings_accept_rates_summing_to_one_and_default_to_nothing() -> None:
    full = DrillSettings(transient_error_rate=0.5, permanent_error_rate=0.3, inconclusive_rate=0.2, duplicate_rate=1)

    assert full.injects_faults
    assert not DrillSettings().injects_faults
    assert not DrillSettings(duplicate_rate=0.5).injects_faults


def test_drill_fraction_is_pinned() -> None:
    # Pinned values: a change to the encoding would silently change which jobs every recorded
    # drill fails, so it must be a deliberate, visible change.
    assert drill_fraction(7, "job-1", 1) == 0.2937177314978102
    assert drill_fraction(0, "key", 1) == 0.40312651123861665


def test_drill_fraction_does_not_depend_on_the_hash_seed() -> None:
    plugins = os.path.dirname(os.path.dirname(triage.__file__))
    code = "from triage.contracts.drill import drill_fraction; print(repr(drill_fraction(7, 'job-1', 1)))"
    env = {**os.environ, "PYTHONPATH": plugins, "PYTHONHASHSEED": "12345"}

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)

    assert float(out.stdout) == drill_fraction(7, "job-1", 1)


@pytest.mark.parametrize(
    ("left", "right"),
    [
        pytest.param((0, "ab", "c"), (0, "a", "bc"), id="part-boundaries"),
        pytest.param((0, "1"), (0, 1), id="int-vs-str"),
        pytest.param((0, "k", 1), (1, "k", 1), id="seed"),
        pytest.param((0, "k", 1), (0, "k", 2), id="attempt"),
    ],
)
def test_drill_fraction_separates_inputs(left: tuple[int, ...], right: tuple[int, ...]) -> None:
    assert drill_fraction(*left) != drill_fraction(*right)


def test_drill_fraction_is_uniform_in_unit_interval() -> None:
    draws = [drill_fraction(3, f"key-{i}") for i in range(20_000)]

    assert all(0.0 <= d < 1.0 for d in draws)
    assert sum(draws) / len(draws) == pytest.approx(0.5, abs=0.01)
    assert sum(d < 0.1 for d in draws) / len(draws) == pytest.approx(0.1, abs=0.01)
