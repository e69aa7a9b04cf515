"""The outbox's own event ids (migration 0035): UUIDv7s made in SQL, inlined into each insert.

An event whose writer brings no id (a registration's ``job.registered``, a move to review's
``job.needs_review``) took ``gen_random_uuid()``: random, and on the embedded server (no
OpenSSL) three system calls an id, ~15 % of a registration's server CPU.
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore


def _registered_event_ids(ledger: sa.Connection) -> list[uuid.UUID]:
    return list(
        ledger.execute(
            sa.text("SELECT event_id FROM triage.outbox WHERE event_type = 'job.registered' ORDER BY event_id")
        ).scalars()
    )


def _clock_ms(ledger: sa.Connection) -> int:
    return int(ledger.execute(sa.text("SELECT floor(date_part('epoch', clock_timestamp()) * 1000)")).scalar_one())


def test_a_registrations_events_get_time_ordered_ids_of_this_millisecond(
    store: JobStore, ledger: sa.Connection
) -> None:
    before = _clock_ms(ledger)
    store.register(new_jobs(500), batch_key="b", step="classify", max_attempts=3)
    after = _clock_ms(ledger)
    ids = _registered_event_ids(ledger)
    assert len(ids) == len(set(ids)) == 500
    assert {i.version for i in ids} == {7}, "UUIDv7, not gen_random_uuid()'s version 4"
    assert {i.variant for i in ids} == {uuid.RFC_4122}
    stamps = {i.int >> 80 for i in ids}  # the 48-bit Unix time in milliseconds
    assert before <= min(stamps) <= max(stamps) <= after


def test_ids_made_later_sort_later(ledger: sa.Connection) -> None:
    """Ordered by the millisecond (the bits within one are random): a batch's events sit at the
    end of ``outbox_pkey``, not spread over it."""
    first = ledger.execute(sa.text("SELECT triage.time_ordered_uuid()")).scalar_one()
    ledger.execute(sa.text("SELECT pg_sleep(0.002)"))
    later = ledger.execute(sa.text("SELECT triage.time_ordered_uuid() FROM generate_series(1, 1000)")).scalars().all()
    assert all(first < i for i in later)
    assert len(set(later)) == 1000


def test_the_default_is_inlined_into_the_insert(ledger: sa.Connection) -> None:
    """Plain SQL without a SET clause, so the planner inlines it: a function call per row (as
    with a pinned search_path) would cost what it saves."""
    plan = "\n".join(
        ledger.execute(
            sa.text(
                "EXPLAIN VERBOSE INSERT INTO triage.outbox"
                " (job_id, event_type, schema_version, attempt, correlation_id, payload_ref)"
                " VALUES ('00000000-0000-0000-0000-000000000001', 'job.registered', 1, 0, 'c', 'ref')"
            )
        ).scalars()
    )
    for inlined in ("clock_timestamp()", "random()"):
        assert inlined in plan, plan
    for called in ("time_ordered_uuid", "gen_random_uuid"):
        assert called not in plan, plan
