"""Reconciliation's report reads its rare rows through partial indexes, never by scanning.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-01

Three of the report's questions ask for rows that are rare but were found by reading every row
that might be one (issue #16, item 3: reconciliation every 15 minutes must not scan history):

- the schema mismatches read every retained transition (a sequential scan of each day partition
  of ``job_events``: 30 days by default) for the reason ``unsupported_schema_version``, and every
  review row ever written (``manual_review`` keeps its resolved rows) for the same reason in its
  context;
- the rejected outputs read every retained classification of the window for the outcome
  ``rejected``.

Each gets a partial index holding only those rows: empty on a healthy ledger, whatever its
size. The one on ``job_events`` is made on the partitioned table, so each day partition has its
own (``ensure_day_partitions`` creates them with it).

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

S = "triage"
UNSUPPORTED = "'unsupported_schema_version'"
INDEXES = (
    ("job_events_unsupported_idx", "job_events", ["job_id"], f"reason = {UNSUPPORTED}"),
    (
        "manual_review_unsupported_idx",
        "manual_review",
        ["job_id"],
        f"(context ->> 'malformed_reason') = {UNSUPPORTED}",
    ),
    ("classifications_rejected_idx", "classifications", ["created_at"], "outcome = 'rejected'"),
)


def upgrade() -> None:
    for name, table, columns, where in INDEXES:
        op.create_index(name, table, columns, schema=S, postgresql_where=sa.text(where))


def downgrade() -> None:
    for name, table, _, _ in INDEXES:
        op.drop_index(name, table_name=table, schema=S)
