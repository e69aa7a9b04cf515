"""Replay by filter: ``terminal_failed -> queued``, and a table of replay requests.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

Until now nothing took a ``terminal_failed`` job back: a rejected job or a permanent failure
stayed failed even once its cause was fixed. A replay by filter (issue #13, item 4) is a
person's deliberate retry of jobs selected by reason, error class, state, source and batch or
date range; it moves ``manual_review`` jobs (a transition 0001 has) and ``terminal_failed`` ones
(the transition added here) to ``queued``. ``job_transitions`` refuses every write through its
``job_transitions_frozen`` trigger ("transitions change only by migration"): this migration
switches that trigger off for its one INSERT, in its own transaction, and on again.

``replay_requests`` keeps one row per replay: its key (a digest of the filter and the note, so
the same submission twice is the same request), the filter, who asked and why, how many jobs it
moved and when it finished. Each moved job's ``job_events`` row carries the key as its reason
(``replayed:<key>``), so the log says which request moved it.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
FROZEN = "job_transitions_frozen"
NEW_TRANSITION = ("terminal_failed", "queued")


def _transitions(statement: str) -> None:
    op.execute(f"ALTER TABLE {S}.job_transitions DISABLE TRIGGER {FROZEN}")
    op.execute(statement)
    op.execute(f"ALTER TABLE {S}.job_transitions ENABLE TRIGGER {FROZEN}")


def upgrade() -> None:
    old, new = NEW_TRANSITION
    _transitions(
        f"INSERT INTO {S}.job_transitions (from_status, to_status) "
        f"VALUES ('{old}'::{S}.job_status, '{new}'::{S}.job_status)"
    )
    op.create_table(
        "replay_requests",
        sa.Column("replay_key", sa.Text, nullable=False),
        sa.Column("filter", pg.JSONB, nullable=False),
        sa.Column("requested_by", sa.Text, nullable=False),
        sa.Column("note", sa.Text, nullable=False),
        sa.Column("requested_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("applied_at", sa.DateTime(timezone=True)),
        sa.Column("replayed", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.PrimaryKeyConstraint("replay_key", name="replay_requests_pkey"),
        sa.CheckConstraint("replayed >= 0", name="replay_requests_replayed_check"),
        schema=S,
        comment="One row per replay by filter: the filter, who asked and why, how many jobs it moved",
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {S}.replay_requests TO {APP}")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {S}.replay_requests")
    old, new = NEW_TRANSITION
    # A job replayed from terminal_failed keeps its history; only the permission goes.
    _transitions(
        f"DELETE FROM {S}.job_transitions WHERE from_status = '{old}'::{S}.job_status "
        f"AND to_status = '{new}'::{S}.job_status"
    )
