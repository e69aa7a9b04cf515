"""Hypothesis strategies shared by the fuzz tests of documents, sources and the pipeline."""

from __future__ import annotations

from hypothesis import strategies as st

OUT_OF_RANGE_TIMESTAMPS = [
    "0001-01-01T00:00:00+14:00",  # before year 1 in UTC: OverflowError in astimezone()
    "0001-01-01T00:00:00.000001+00:01",
    "0001-01-01T13:59:59+23:59",
    "9999-12-31T23:59:59.999999-14:00",  # after year 9999 in UTC
    "9999-12-31T10:00:00-23:59",
]
"""ISO 8601 strings that parse, with their offset, but name no instant Python can hold in UTC."""

EDGE_DAYS = ["0001-01-01", "0001-01-02", "9999-12-30", "9999-12-31"]


def _offset(sign: str, hours: int, minutes: int) -> str:
    return f"{sign}{hours:02d}:{minutes:02d}"


offsets = st.just("Z") | st.builds(_offset, st.sampled_from("+-"), st.integers(0, 23), st.integers(0, 59))
"""Every offset ISO 8601 and pydantic accept, the extreme ones included."""

timestamps = st.sampled_from(OUT_OF_RANGE_TIMESTAMPS) | st.builds(
    lambda day, time, offset: f"{day}T{time.isoformat()}{offset}",
    st.sampled_from(EDGE_DAYS) | st.dates().map(lambda d: d.isoformat()),
    st.times(),
    offsets,
)
"""``received_at`` strings at the edges of the calendar with any offset: most are valid, some
overflow once converted to UTC; a parser must refuse those with a reason, never raise."""
