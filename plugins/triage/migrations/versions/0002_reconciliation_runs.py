"""Reconciliation runs: one row per ``reconcile_jobs`` run with its findings and repairs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30

Frozen history: this file states the schema as it was created and does not import the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

S = "triage"


def _jsonb(name: str, default: str) -> sa.Column:
    return sa.Column(name, pg.JSONB, nullable=False, server_default=sa.text(f"'{default}'::jsonb"))


def upgrade() -> None:
    op.create_table(
        "reconciliation_runs",
        sa.Column("id", sa.BigInteger, sa.Identity(always=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.Column("dry_run", sa.Boolean, nullable=False),
        _jsonb("params", "{}"),
        _jsonb("findings", "[]"),
        _jsonb("repairs", "[]"),
        _jsonb("summary", "{}"),
        sa.Column("report_path", sa.Text),
        sa.PrimaryKeyConstraint("id", name="reconciliation_runs_pkey"),
        schema=S,
        comment="One row per reconcile_jobs run: its params, findings, repairs and report summary",
    )
    op.create_index("reconciliation_runs_started_at_idx", "reconciliation_runs", ["started_at"], schema=S)


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {S}.reconciliation_runs")
