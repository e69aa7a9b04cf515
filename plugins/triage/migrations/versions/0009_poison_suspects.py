"""Poison isolation: a job whose claim died under it is a suspect, claimed in smaller groups.

Revision ID: 0009
Revises: 0007
Create Date: 2026-12-01

``jobs.suspect_cap``: NULL for a clean job; otherwise the largest claim this job may be part of
next. Set when a lease is taken back from a dead claim (half the dead claim's unfinished jobs,
at least 1) and kept until the job advances to its next step. The partial index serves the
claim's probe for suspects: it holds only claimable suspects, so on the common path (none) the
probe reads an empty index.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

S = "triage"
CAP_CHECK = "jobs_suspect_cap_positive_check"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("suspect_cap", sa.Integer), schema=S)
    op.create_check_constraint(op.f(CAP_CHECK), "jobs", "suspect_cap >= 1", schema=S)
    op.create_index(
        "jobs_suspects_idx",
        "jobs",
        ["batch_key", "step", "suspect_cap"],
        schema=S,
        postgresql_where=sa.text("suspect_cap IS NOT NULL AND status IN ('queued', 'retryable_failed')"),
    )


def downgrade() -> None:
    op.drop_index("jobs_suspects_idx", table_name="jobs", schema=S)
    op.drop_constraint(op.f(CAP_CHECK), "jobs", schema=S)
    op.drop_column("jobs", "suspect_cap", schema=S)
