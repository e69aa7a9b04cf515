"""Reading labelled examples without a database: every bad line is refused with its number and
a reason, never a crash, and the good ones around it are kept."""

from __future__ import annotations

import io
import json

import pytest

from triage.learning.examples import InvalidSource, LabelledDocument, Refusal, check_source, read_examples

NAMES = {"billing", "shipping"}


def good(external_id: str, label: str = "billing") -> bytes:
    return json.dumps({"id": external_id, "subject": "s", "body": "b", "label": label}).encode()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        pytest.param(b"\xff\xfe not utf-8", "invalid_utf8", id="bytes"),
        pytest.param(b"[1, 2]", "not_an_object", id="array"),
        pytest.param(
            b'{"id": "x", "subject": "s", "body": "b", "label": ["billing"]}', "invalid_label", id="label-list"
        ),
        pytest.param(
            b'{"id": "x", "subject": "s", "body": "b", "label": "\\u0000"}', "label_outside_taxonomy", id="nul"
        ),
        pytest.param(b'{"id": "x\\u0000y", "subject": "s", "body": "b", "label": "billing"}', "nul_in_id", id="nul-id"),
        pytest.param(b'{"id": "  ", "subject": "s", "body": "b", "label": "billing"}', "empty_id", id="blank-id"),
        pytest.param(
            b'{"id": "x", "subject": "\\ud800", "body": "b", "label": "billing"}', "invalid_field", id="surrogate"
        ),
        pytest.param(
            b'{"id": "x", "subject": "s", "body": "b", "received_at": "2026-11-01T09:00:00", "label": "billing"}',
            "naive_received_at",
            id="naive-time",
        ),
        pytest.param(b'{"id": "x", "subject": 1, "body": "b", "label": "billing"}', "invalid_field", id="number"),
        pytest.param(b'{"id": "x", "body": "b", "label": "billing"}', "missing_field", id="no-subject"),
        pytest.param(
            b'{"id": "x", "subject": "s", "body": "b", "label": "billing", "x": 1}', "unexpected_field", id="extra"
        ),
        pytest.param(b"x" * 5000, "line_too_long", id="too-long"),
    ],
)
def test_a_bad_line_is_refused_alone(line: bytes, reason: str) -> None:
    stream = io.BytesIO(b"\n".join([good("A"), line, good("B", "shipping")]) + b"\n")
    read = list(read_examples(stream, NAMES, max_line_bytes=4096))
    assert [type(r) for r in read] == [LabelledDocument, Refusal, LabelledDocument]
    refusal = read[1]
    assert isinstance(refusal, Refusal)
    assert (refusal.position, refusal.reason) == (2, reason)
    assert refusal.message().startswith(f"line 2: {reason}: ")
    assert [r.payload.external_id for r in read if isinstance(r, LabelledDocument)] == ["A", "B"]


@pytest.mark.parametrize("depth", [2_000, 100_000])
def test_json_nested_past_the_parser_is_refused_alone(depth: int) -> None:
    """Nesting deeper than the parser goes is a refused line, never a crash. Where it gives up
    depends on the interpreter (CPython 3.11 at 2,000 levels; 3.13's C scanner parses those,
    and the line is then an array): both are refusals of that line alone."""
    line = b"[" * depth + b"]" * depth
    stream = io.BytesIO(b"\n".join([good("A"), line, good("B", "shipping")]) + b"\n")
    read = list(read_examples(stream, NAMES, max_line_bytes=1 << 20))
    assert [type(r) for r in read] == [LabelledDocument, Refusal, LabelledDocument]
    refusal = read[1]
    assert isinstance(refusal, Refusal)
    assert refusal.position == 2
    assert refusal.reason in ({"invalid_json", "not_an_object"} if depth == 2_000 else {"invalid_json"})


def test_a_refusal_never_echoes_a_long_or_unprintable_label() -> None:
    line = json.dumps({"id": "x", "subject": "s", "body": "b", "label": "evil\n" + "y" * 500}).encode()
    [refusal] = read_examples(io.BytesIO(line), NAMES)
    assert isinstance(refusal, Refusal)
    assert len(refusal.detail) < 200
    assert "\n" not in refusal.detail


def test_received_at_may_be_left_out_and_a_given_one_is_kept() -> None:
    dated = json.dumps(
        {"id": "d", "subject": "s", "body": "b", "received_at": "2026-11-01T09:00:00+01:00", "label": "billing"}
    )
    [undated, given] = read_examples(io.BytesIO(good("u") + b"\n" + dated.encode()), NAMES)
    assert isinstance(undated, LabelledDocument)
    assert isinstance(given, LabelledDocument)
    assert given.payload.received_at.isoformat() == "2026-11-01T08:00:00+00:00"


@pytest.mark.parametrize("source", ["review", "", "a b", "x" * 65, "ünï", "../etc"])
def test_an_import_source_is_a_plain_name_and_not_the_reviewers(source: str) -> None:
    with pytest.raises(InvalidSource):
        check_source(source)
    assert check_source("helpdesk-2026.export:v1") == "helpdesk-2026.export:v1"


def test_a_byte_order_mark_and_crlf_line_ends_are_read_as_an_editor_writes_them() -> None:
    """A file saved by a Windows editor: UTF-8 with a BOM, CRLF lines. Its first line was refused
    as invalid_json (the BOM), losing a good example."""
    stream = io.BytesIO(b"\xef\xbb\xbf" + good("A") + b"\r\n" + good("B", "shipping") + b"\r\n")
    read = list(read_examples(stream, NAMES))
    assert [(r.payload.external_id, r.label, r.position) for r in read if isinstance(r, LabelledDocument)] == [
        ("A", "billing", 1),
        ("B", "shipping", 2),
    ]
    assert all(isinstance(r, LabelledDocument) for r in read)
    # Only the file's start may carry the mark: inside the file it is a character of a line.
    later = list(read_examples(io.BytesIO(good("A") + b"\n\xef\xbb\xbf" + good("B")), NAMES))
    assert isinstance(later[1], Refusal)
    assert later[1].reason == "invalid_json"


def test_a_huge_field_over_http_is_refused_like_a_long_line() -> None:
    """The HTTP batch has no lines: each example is held to the inbox's line bound all the same."""
    from triage.learning.examples import parse_example

    refused = parse_example({"id": "H", "subject": "s", "body": "x" * (2 << 20), "label": "billing"}, NAMES, position=3)
    assert isinstance(refused, Refusal)
    assert (refused.position, refused.reason, refused.external_id) == (3, "line_too_long", "H")
