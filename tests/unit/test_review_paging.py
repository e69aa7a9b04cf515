"""The queue's cursors for ``order=uncertainty`` (no database): exact round trips, and no cursor
read as the other order's."""

from __future__ import annotations

import base64
from datetime import UTC, datetime

import pytest

from triage.web.paging import (
    BadQuery,
    decode_cursor,
    decode_uncertain_cursor,
    encode_cursor,
    encode_uncertain_cursor,
    parse_order,
)

AT = datetime(2026, 11, 1, 9, 30, 15, 123456, tzinfo=UTC)


@pytest.mark.parametrize("key", [0.0, 0.1 + 0.2, 0.48990000000000006, 2.0, -1.0, 5e-324])
def test_an_uncertainty_cursor_round_trips_exactly(key: float) -> None:
    """The key is compared with ``>`` in SQL: a cursor that came back one ulp off would skip or
    repeat a row."""
    assert decode_uncertain_cursor(encode_uncertain_cursor((key, AT, 42))) == (key, AT, 42)


def test_a_cursor_of_one_order_is_refused_by_the_other() -> None:
    with pytest.raises(BadQuery, match="order=uncertainty"):
        decode_uncertain_cursor(encode_cursor((AT, 42)))
    with pytest.raises(BadQuery, match="not a cursor"):
        decode_cursor(encode_uncertain_cursor((0.5, AT, 42)))


@pytest.mark.parametrize(
    "raw",
    [
        pytest.param("u|nan|2026-11-01T00:00:00+00:00|1", id="nan"),
        pytest.param("u|inf|2026-11-01T00:00:00+00:00|1", id="infinity"),
        pytest.param("x|0.5|2026-11-01T00:00:00+00:00|1", id="other-tag"),
        pytest.param("u|0.5|2026-11-01T00:00:00|1", id="no-time-zone"),
        pytest.param("u|0.5|2026-11-01T00:00:00+00:00|-1", id="negative-id"),
        pytest.param("u|0.5|2026-11-01T00:00:00+00:00|9223372036854775808", id="id-past-bigint"),
        pytest.param("u|0.5", id="short"),
    ],
)
def test_a_forged_uncertainty_cursor_is_a_bad_query(raw: str) -> None:
    text = base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")
    with pytest.raises(BadQuery):
        decode_uncertain_cursor(text)


@pytest.mark.parametrize(
    ("given", "order"), [(None, "oldest"), ("", "oldest"), (" uncertainty ", "uncertainty"), ("oldest", "oldest")]
)
def test_orders(given: str | None, order: str) -> None:
    assert parse_order(given) == order


def test_an_unknown_order_is_a_bad_query() -> None:
    with pytest.raises(BadQuery, match="one of oldest, uncertainty"):
        parse_order("newest")
