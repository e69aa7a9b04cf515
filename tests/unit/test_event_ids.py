"""The outbox event ids a batch brings (triage.jobs.sql.expressions.event_ids): UUIDv7, distinct,
time-ordered from one batch to the next."""

from __future__ import annotations

import time
import uuid

from triage.jobs.sql.expressions import event_ids


def test_event_ids_are_distinct_uuidv7_of_this_millisecond() -> None:
    before = time.time_ns() // 1_000_000
    ids = [uuid.UUID(hex=h) for h in event_ids(5_000)]
    after = time.time_ns() // 1_000_000
    assert len(set(ids)) == 5_000
    assert {i.version for i in ids} == {7}
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    assert {i.int >> 80 for i in ids} <= set(range(before, after + 1))  # the 48-bit Unix milliseconds
    assert len({i.int & ((1 << 62) - 1) for i in ids}) == 5_000  # the random tail differs


def test_a_later_batch_sorts_after_an_earlier_one() -> None:
    first = event_ids(100)
    time.sleep(0.002)
    second = event_ids(100)
    assert max(uuid.UUID(h) for h in first) < min(uuid.UUID(h) for h in second)


def test_no_ids_for_an_empty_batch() -> None:
    assert event_ids(0) == []


def test_ids_sort_in_the_order_they_were_drawn_within_and_across_batches() -> None:
    # Two batches drawn back to back usually share a millisecond: the counter continues, so the
    # second still sorts after the first (a review queue breaks ties of time by id).
    drawn = [uuid.UUID(h) for _ in range(50) for h in event_ids(300)]
    assert drawn == sorted(drawn)
    assert len(set(drawn)) == len(drawn)


def test_a_batch_larger_than_a_milliseconds_counter_is_refused() -> None:
    import pytest

    with pytest.raises(ValueError, match="at most"):
        event_ids((1 << 28) + 1)
