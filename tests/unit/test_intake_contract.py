"""Intake's request contract, fast path against slow path: a body read in one pass
(:func:`validate_body`, pydantic over the bytes) accepts exactly what ``json.loads`` and a
validation per document accept, with the same values; :meth:`IntakeDocument.payload_bytes`
writes exactly the bytes of ``payload().to_bytes()`` and refuses what it refuses; the id check's
ASCII shortcut answers as the character-by-character check does."""

from __future__ import annotations

import json
import re
import unicodedata
from datetime import date
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from tests.strategies import OUT_OF_RANGE_TIMESTAMPS, offsets, timestamps
from triage.contracts.intake import IntakeDocument, hostile_id_problem, parse_documents, validate_body

# Text as clients send it: any character JSON can carry (no lone surrogates: json.dumps would
# escape them and both parsers refuse or keep them differently; tested on their own below).
texts = st.text(st.characters(codec="utf-8"), max_size=40)
ids = st.one_of(
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,20}", fullmatch=True),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:/-]{0,20}", fullmatch=True),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12),
)
scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    texts,
)
in_range = st.builds(
    lambda day, time, offset: f"{day.isoformat()}T{time.isoformat()}{offset}",
    st.dates(min_value=date(1, 1, 2), max_value=date(9999, 12, 30)),
    st.times(),
    offsets,
)
"""``received_at`` strings that name an instant of the years 1-9999 in UTC, whatever the offset."""
documents = st.fixed_dictionaries(
    {
        "source": st.sampled_from(["helpdesk", "mail.eu", "a", "x-1", "x_2", "Bad Source"]),
        "external_id": ids,
        "subject": texts,
        "body": texts,
        "received_at": st.one_of(in_range, in_range, in_range, timestamps),
    },
    optional={
        "channel": st.none() | texts,
        "correlation_id": st.none() | st.sampled_from(["trace-1", "a:b.c", "Z9", "has space"]),
        "metadata": st.none() | st.dictionaries(st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True), scalars),
    },
)


def slow_path(body: bytes) -> tuple[list[tuple[IntakeDocument, bytes]], bool] | None:
    """What the per-document path accepts of ``body`` when nothing in it is wrong."""
    data = json.loads(body)
    batch = isinstance(data, dict) and set(data) == {"documents"} and isinstance(data["documents"], list)
    items = data["documents"] if batch else [data]
    valid, problems = parse_documents(items)
    if problems or not valid:
        return None
    return [(doc, content) for _i, doc, content in valid], batch


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(documents, min_size=1, max_size=3), st.booleans())
def test_one_pass_accepts_what_the_per_document_path_accepts_with_the_same_values(
    items: list[dict[str, Any]], as_batch: bool
) -> None:
    body = json.dumps({"documents": items} if as_batch or len(items) > 1 else items[0]).encode()
    slow = slow_path(body)
    fast = validate_body(body)
    fast_contents: list[bytes] = []
    if fast is not None:
        try:
            fast_contents = [d.payload_bytes() for d in fast[0]]
        except ValueError:
            fast = None  # the web layer then takes the per-document path
    if slow is None:
        assert fast is None
        return
    assert fast is not None, body
    assert fast[1] == slow[1]
    assert fast[0] == [doc for doc, _content in slow[0]]
    assert fast_contents == [content for _doc, content in slow[0]]


@settings(max_examples=300, deadline=None)
@given(documents)
def test_payload_bytes_are_the_payload_s_bytes_or_both_refuse(item: dict[str, Any]) -> None:
    try:
        document = IntakeDocument.model_validate(item)
    except ValidationError:
        return
    try:
        expected: bytes | None = document.payload().to_bytes()
    except (ValidationError, ValueError):
        expected = None
    if expected is None:
        with pytest.raises(ValueError, match=r"years 1-9999|surrogate|encode"):
            document.payload_bytes()
    else:
        assert document.payload_bytes() == expected


def _doc(**overrides: Any) -> dict[str, Any]:
    return {
        "source": "helpdesk",
        "external_id": "T-1",
        "subject": "s",
        "body": "b",
        "received_at": "2026-12-01T09:00:00+00:00",
        **overrides,
    }


@pytest.mark.parametrize("received_at", OUT_OF_RANGE_TIMESTAMPS)
def test_payload_bytes_refuse_a_time_outside_the_calendar_in_utc(received_at: str) -> None:
    document = IntakeDocument.model_validate(_doc(received_at=received_at))
    with pytest.raises(ValidationError):
        document.payload()
    with pytest.raises(ValueError, match="years 1-9999"):
        document.payload_bytes()


@pytest.mark.parametrize("field", ["subject", "body", "channel"])
def test_a_lone_surrogate_is_refused_by_both_paths(field: str) -> None:
    body = json.dumps({"documents": [_doc(**{field: "a\ud800b"})]}).encode()  # escaped: \ud800
    assert validate_body(body) is None  # pydantic's parser refuses it: the per-document path says why
    valid, problems = parse_documents(json.loads(body)["documents"])
    assert valid == []
    [problem] = problems
    assert problem.errors[0]["field"] == "document" or field in problem.errors[0]["field"]
    with pytest.raises(ValidationError):  # nor does the model hold one from a Python caller
        IntakeDocument.model_validate(_doc(**{field: "a\ud800b"}))
    unchecked = IntakeDocument.model_validate(_doc()).model_copy(update={field: "a\ud800b"})
    with pytest.raises(UnicodeEncodeError):  # and no bytes could be written from one (not UTF-8)
        unchecked.payload_bytes()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b'{"documents": []}', id="empty-batch"),
        pytest.param(b'{"documents": [], "x": 1}', id="batch-with-extra"),
        pytest.param(b"\xef\xbb\xbf" + json.dumps(_doc()).encode(), id="utf8-bom"),
        pytest.param(json.dumps(_doc()).encode("utf-16"), id="utf-16"),
        pytest.param(json.dumps({"documents": [_doc(), {**_doc(), "body": 1}]}).encode(), id="one-invalid"),
    ],
)
def test_bodies_the_one_pass_does_not_take_go_to_the_per_document_path(body: bytes) -> None:
    fast = validate_body(body)
    assert fast is None or fast[0] == []


def _hostile_before(value: str) -> str | None:
    """The check as it was before its ASCII shortcut (the reference)."""
    if value != value.strip():
        return "external_id has leading or trailing whitespace"
    if any(unicodedata.category(c) in {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"} for c in value):
        return "external_id holds a control, format or unassigned character"
    if value.startswith(("/", "\\")) or any(part in (".", "..") for part in re.split(r"[/\\]", value)):
        return "external_id looks like a path (a leading slash, or a '.' or '..' segment)"
    return None


@settings(max_examples=1000, deadline=None)
@given(
    st.text(max_size=12)
    | st.text(st.characters(min_codepoint=0, max_codepoint=0x7F), max_size=12)
    | st.text(st.sampled_from("./\\a\n"), max_size=10)  # the path check's own alphabet
)
def test_the_id_check_s_shortcuts_change_no_answer(value: str) -> None:
    assert hostile_id_problem(value) == _hostile_before(value)
