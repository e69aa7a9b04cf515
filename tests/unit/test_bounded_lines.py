"""Reading inbox lines with a bound: a line over the limit is skipped without being held whole,
its size and position are known, and the lines after it read as usual."""

from __future__ import annotations

import io
import json
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.sources.jsonl import MAX_LINE_BYTES, JsonlSource
from triage.sources.lines import bounded_lines

DAY = datetime(2026, 11, 1, tzinfo=UTC)


def lines_of(data: bytes, limit: int, block: int = 4) -> list[tuple[bytes, int, bool, bool]]:
    return [(x.content, x.size, x.oversized, x.blank) for x in bounded_lines(io.BytesIO(data), limit, block=block)]


@pytest.mark.parametrize(
    ("data", "limit", "expected"),
    [
        pytest.param(b"", 5, [], id="empty-stream"),
        pytest.param(b"abc", 5, [(b"abc", 3, False, False)], id="no-final-newline"),
        pytest.param(b"abc\n", 5, [(b"abc", 3, False, False)], id="final-newline-is-no-line"),
        pytest.param(b"\n\n", 5, [(b"", 0, False, True), (b"", 0, False, True)], id="empty-lines"),
        pytest.param(b"12345\n", 5, [(b"12345", 5, False, False)], id="exactly-the-limit"),
        pytest.param(b"123456\n", 5, [(b"12345", 6, True, False)], id="one-over"),
        pytest.param(b"12345\r\n", 5, [(b"12345", 5, False, False)], id="crlf-at-the-limit"),
        pytest.param(b"123456\r\n", 5, [(b"12345", 6, True, False)], id="crlf-one-over"),
        pytest.param(b"12345\r", 5, [(b"12345", 5, False, False)], id="final-cr"),
        pytest.param(b"a\rb\n", 5, [(b"a\rb", 3, False, False)], id="inner-cr-kept"),
        pytest.param(
            b"x" * 50 + b"\nok\n",
            5,
            [(b"xxxxx", 50, True, False), (b"ok", 2, False, False)],
            id="oversized-then-a-line",
        ),
        pytest.param(b" " * 50 + b"\n", 5, [(b"     ", 50, True, True)], id="oversized-blank"),
        pytest.param(b" " * 49 + b"x\n", 5, [(b"     ", 50, True, False)], id="oversized-not-blank-at-its-end"),
        pytest.param(b"y" * 50, 5, [(b"yyyyy", 50, True, False)], id="oversized-last-line"),
    ],
)
@pytest.mark.parametrize("block", [1, 2, 3, 4, 7, 64])
def test_lines_and_their_bounds(
    data: bytes, limit: int, expected: list[tuple[bytes, int, bool, bool]], block: int
) -> None:
    assert lines_of(data, limit, block) == expected


def reference(data: bytes, limit: int) -> list[tuple[bytes, int, bool, bool]]:
    """What ``bounded_lines`` must give, from the whole input split at once."""
    parts = data.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    out = []
    for raw in parts:
        line = raw[:-1] if raw.endswith(b"\r") else raw
        out.append((line[:limit], len(line), len(line) > limit, not line.strip()))
    return out


@settings(max_examples=400)
@given(
    data=st.binary(max_size=200)
    | st.lists(st.sampled_from([b"a", b" ", b"\r", b"\n", b"\r\n"]), max_size=60).map(b"".join),
    limit=st.integers(1, 12),
    block=st.integers(1, 16),
)
def test_bounded_lines_agree_with_splitting_the_whole_input(data: bytes, limit: int, block: int) -> None:
    assert lines_of(data, limit, block) == reference(data, limit)
    numbers = [x.number for x in bounded_lines(io.BytesIO(data), limit, block=block)]
    assert numbers == list(range(1, len(numbers) + 1))


def test_a_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        list(bounded_lines(io.BytesIO(b"x"), 0))
    with pytest.raises(ValueError, match="positive"):
        JsonlSource("/nowhere", max_line_bytes=0)


HUGE = 64 << 20
LIMIT = 4096
HUGE_HEAD = b'{"id": "T-\\"huge\\"", "subject": "s", "body": "'
HUGE_LINE_BYTES = len(HUGE_HEAD) + HUGE + len(b'"}')


def ticket(ticket_id: str, body: str = "b") -> bytes:
    return json.dumps({"id": ticket_id, "subject": "s", "body": body, "received_at": "2026-11-01T08:00:00Z"}).encode()


def write_huge_day(inbox: Path) -> None:
    """before / a 64 MiB line (a ticket whose body never ends, written in pieces) / after."""
    folder = inbox / "2026-11-01"
    folder.mkdir(parents=True)
    with (folder / "day.jsonl").open("wb") as out:
        out.write(ticket("before") + b"\n")
        out.write(HUGE_HEAD)
        piece = b"x" * (1 << 20)
        for _ in range(HUGE >> 20):
            out.write(piece)
        out.write(b'"}\n' + ticket("after") + b"\n")


@pytest.mark.parametrize("limit", [pytest.param(LIMIT, id="small-limit"), pytest.param(MAX_LINE_BYTES, id="default")])
def test_a_huge_line_is_never_held_whole(tmp_path: Path, limit: int) -> None:
    # It used to be read whole before its length was checked: a 300 MB line took 670 MB per
    # retrieve shard, and a multi-GB one was OOM-killed on every retry.
    write_huge_day(tmp_path)
    source = JsonlSource(tmp_path, max_line_bytes=limit) if limit != MAX_LINE_BYTES else JsonlSource(tmp_path)

    tracemalloc.start()
    try:
        documents = list(source.read(DAY, DAY + timedelta(days=1)))
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    # The line's head (twice: the buffer and its copy) and two blocks; nothing near 64 MiB.
    assert peak < 2 * limit + (1 << 20), f"reading a {HUGE >> 20} MiB line peaked at {peak / (1 << 20):.1f} MiB"
    assert [(d.external_id, d.malformed_reason) for d in documents] == [
        ("before", None),
        ("2026-11-01/day.jsonl:2", "line_too_long"),
        ("after", None),
    ]
    huge = documents[1]
    assert len(huge.content) == limit  # the head, for the reviewer; the rest was skipped
    assert dict(huge.detail) == {"line": 2, "line_bytes": HUGE_LINE_BYTES, "claimed_id": 'T-"huge"'}


@pytest.mark.parametrize(
    ("head", "claimed"),
    [
        pytest.param(b'{"id": "T-9", "body": "' + b"x" * 100, "T-9", id="id-first"),
        pytest.param(b' \t{ "id" :"caf\\u00e9", "b' + b"x" * 100, "café", id="escapes-and-spaces"),
        pytest.param(b'{"body": "' + b"x" * 100, None, id="id-not-first"),
        pytest.param(b'{"id": 7, "body": "' + b"x" * 100, None, id="id-not-a-string"),
        pytest.param(b'{"id": "   ", "body": "' + b"x" * 100, None, id="blank-id"),
        pytest.param(b'{"id": "a\\u0000b", "body": "' + b"x" * 100, None, id="nul-in-id"),
        pytest.param(b'{"id": "\\ud800", "body": "' + b"x" * 100, None, id="lone-surrogate"),
        pytest.param(b'{"id": "' + b"x" * 100, None, id="id-cut-off"),
        pytest.param(b'{"id": "\xff\xfe", "body": "' + b"x" * 100, None, id="not-utf8"),
    ],
)
def test_an_oversized_line_names_its_claimed_id_when_it_leads(head: bytes, claimed: str | None) -> None:
    [document] = JsonlSource("/unused", max_line_bytes=60).read_lines("d/f.jsonl", io.BytesIO(head + b"\n"))

    assert document.malformed_reason == "line_too_long"
    assert dict(document.detail).get("claimed_id") == claimed
