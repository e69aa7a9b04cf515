"""Outbox claims: a relay claims events in one short transaction and sends them outside any.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

Until now a relay held the events it sent locked (``FOR UPDATE``) in a transaction that stayed
open for the whole send, a webhook batch included. Now a relay writes a claim, one row naming
the batch's event ids, and commits; other relays leave those events alone until
``claimed_until``, then take them over (the relay died mid-send). Marking the events published
deletes the claim, so a relay whose claim was taken over marks nothing. One row per batch
rather than a column per event: the claim costs one insert, not a thousand row updates.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"


def upgrade() -> None:
    op.create_table(
        "outbox_claims",
        sa.Column("token", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("event_ids", pg.ARRAY(pg.UUID(as_uuid=True)), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.PrimaryKeyConstraint("token", name="outbox_claims_pkey"),
        schema=S,
        comment="A relay's claim on a batch of unsent outbox events while it sends them",
    )
    op.execute(f"GRANT SELECT, INSERT, DELETE ON {S}.outbox_claims TO {APP}")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {S}.outbox_claims")
