"""The outbox checks the event envelope where it is written: the relay writes PostgreSQL's bytes through.

Revision ID: 0034
Revises: 0033
Create Date: 2026-12-05

Issue #29 (a relay that costs nothing): the relay validated every claimed batch into pydantic
``WorkEvent`` models (~10-12 µs an event, most of its CPU) before the JSON-lines sink serialised
them again. Now the claim returns each event already as ``WorkEvent.to_json``'s bytes
(:mod:`triage.jobs.sql.writes.outbox`) and the sinks write them through, so what the model
checked is checked here, when the row is written, by every writer alike:

- ``outbox_event_type_known_check``: one of the contract's event types;
- ``outbox_schema_version_supported_check``: version 1 (a new version is a new migration);
- ``outbox_attempt_check``: ``attempt >= 0``;
- ``outbox_envelope_check``: a correlation id and a payload reference, neither empty. Rows
  published before 0029 carry neither (their envelope was joined at relay time): they are
  published and never relayed again, so the check asks it of unpublished rows only
  (``published_at`` is set only on those);
- ``outbox_payload_object_check``: the payload is a JSON object (``{}``: none);
- ``outbox_occurred_at_check``: ``created_at`` a finite time a ``datetime`` can hold.

The ids are uuids by type, every column but the two of the envelope NOT NULL. Each constraint is
added NOT VALID (a brief lock, no scan) and then validated (a scan that blocks no writer).

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0034"
down_revision = "0033"
branch_labels = None
depends_on = None

S = "triage"
EVENT_TYPES = ("job.registered", "job.completed", "job.requeued", "job.reviewed", "job.needs_review", "job.failed")

CHECKS = {
    "outbox_event_type_known_check": "event_type IN ({})".format(", ".join(f"'{t}'" for t in EVENT_TYPES)),
    "outbox_schema_version_supported_check": "schema_version IN (1)",
    "outbox_attempt_check": "attempt >= 0",
    "outbox_envelope_check": (
        "published_at IS NOT NULL OR (correlation_id IS NOT NULL AND correlation_id <> ''"
        " AND payload_ref IS NOT NULL AND payload_ref <> '')"
    ),
    "outbox_payload_object_check": "jsonb_typeof(payload) = 'object'",
    "outbox_occurred_at_check": "created_at >= '0001-01-01 00:00:00+00' AND created_at < '10000-01-01 00:00:00+00'",
}


def upgrade() -> None:
    for name, condition in CHECKS.items():
        op.execute(f"ALTER TABLE {S}.outbox ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
    for name in CHECKS:
        op.execute(f"ALTER TABLE {S}.outbox VALIDATE CONSTRAINT {name}")


def downgrade() -> None:
    for name in reversed(CHECKS):
        op.execute(f"ALTER TABLE {S}.outbox DROP CONSTRAINT IF EXISTS {name}")
