"""The outbox's event ids are made in the database without a system call: time-ordered, from its PRNG.

Revision ID: 0035
Revises: 0034
Create Date: 2026-12-05

Issue #29 (PostgreSQL's CPU a document): an outbox row whose writer brings no id (each
``job.registered`` event of a registration, each ``job.needs_review`` of a move to review, the
events of reviews, replays and repairs) took ``gen_random_uuid()``. A PostgreSQL built without
OpenSSL (the embedded server every local run and ``make up`` use) reads each such uuid from
``/dev/urandom``: an open, a read and a close, ~3.2 µs a uuid; ~15 % of a registration's server
CPU (``perf`` of the backend). And the ids were random, so each batch's events were spread over
``outbox_pkey`` instead of sitting at its end.

``triage.time_ordered_uuid()``: a UUIDv7 (RFC 9562) of the clock's milliseconds and 74 bits
of ``random()`` (the backend's PRNG, seeded once from the system's strong random), ~0.5 µs; the
outbox's ``event_id`` default. An event id needs to be unique, not unguessable: two events
collide only when made in the same millisecond with the same 74 bits. Ids made by one
statement are ordered by the millisecond only (the bits within one are random, not a
counter): nothing orders events by id but the relay within one transaction
(``(txid, event_id)``, docs/events.md), where any fixed order does. Writers that bring their own
ids (a completion's, intake's: ``triage.jobs.sql.expressions.event_ids``) are unchanged.

The function is plain SQL with schema-qualified calls and no ``SET`` clause, so the planner
inlines it into each INSERT (a ``SET`` would make it a function call per row). It is
``SECURITY INVOKER`` and reads nothing: EXECUTE stays granted to PUBLIC (a column default runs
with the inserting role's privileges; every role that may insert into the outbox, the app and
review roles, needs it). ``PARALLEL RESTRICTED``, as ``random()`` is.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0035"
down_revision = "0034"
branch_labels = None
depends_on = None

S = "triage"

# The 48-bit Unix time in milliseconds, the version (7) and 12 random bits; then the variant
# (binary 10) and 62 random bits. ``date_part`` is a float8 (``extract`` a numeric, slower);
# a float8 holds today's milliseconds to ~0.2 µs. 2147483648 = 2^31.
TIME_ORDERED_UUID = f"""
CREATE FUNCTION {S}.time_ordered_uuid() RETURNS uuid
LANGUAGE sql VOLATILE PARALLEL RESTRICTED AS $$
SELECT pg_catalog.encode(
    pg_catalog.int8send(
        (pg_catalog.floor(pg_catalog.date_part('epoch', pg_catalog.clock_timestamp()) * 1000)::pg_catalog.int8
         OPERATOR(pg_catalog.<<) 16)
        OPERATOR(pg_catalog.|) 28672
        OPERATOR(pg_catalog.|) pg_catalog.floor(pg_catalog.random() * 4096)::pg_catalog.int8)
    OPERATOR(pg_catalog.||) pg_catalog.int8send(
        (pg_catalog.floor(pg_catalog.random() * 2147483648)::pg_catalog.int8 OPERATOR(pg_catalog.<<) 31)
        OPERATOR(pg_catalog.|) pg_catalog.floor(pg_catalog.random() * 2147483648)::pg_catalog.int8
        OPERATOR(pg_catalog.|) (x'8000000000000000')::pg_catalog.int8),
    'hex')::pg_catalog.uuid
$$;
COMMENT ON FUNCTION {S}.time_ordered_uuid() IS
    'A UUIDv7: the clock''s milliseconds and 74 bits of random(); the outbox''s event ids (0035)';
"""


def upgrade() -> None:
    op.execute(TIME_ORDERED_UUID)
    # On the partitioned table: its partitions take it too, and every insert goes through it.
    op.execute(f"ALTER TABLE {S}.outbox ALTER COLUMN event_id SET DEFAULT {S}.time_ordered_uuid()")


def downgrade() -> None:
    op.execute(f"ALTER TABLE {S}.outbox ALTER COLUMN event_id SET DEFAULT gen_random_uuid()")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.time_ordered_uuid()")
