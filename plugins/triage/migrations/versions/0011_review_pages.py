"""The review pages: the open-review queue read page by page, a report found by its Airflow run.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01

The review queue page (the Airflow plugin at ``/triage``) reads open reviews oldest first, a
page at a time, continuing after the last row it showed (keyset pagination on
``(created_at, id)``). Two partial indexes hold only open reviews, so a page is one index range
scan whatever the number of resolved rows: ``manual_review_open_queue_idx`` for the queue as a
whole, ``manual_review_open_reason_idx`` for the queue filtered by reason.

``reconciliation_runs.dag_run_id``: the Airflow run of ``reconcile_jobs`` that made the row, so
the report tab of a run page finds its report in the database (NULL for runs made outside
Airflow, and for the rows of earlier revisions).

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

S = "triage"
OPEN = sa.text("resolved_at IS NULL")


def upgrade() -> None:
    op.create_index(
        "manual_review_open_queue_idx", "manual_review", ["created_at", "id"], schema=S, postgresql_where=OPEN
    )
    op.create_index(
        "manual_review_open_reason_idx",
        "manual_review",
        ["reason", "created_at", "id"],
        schema=S,
        postgresql_where=OPEN,
    )
    op.add_column("reconciliation_runs", sa.Column("dag_run_id", sa.Text), schema=S)
    op.create_index("reconciliation_runs_dag_run_id_idx", "reconciliation_runs", ["dag_run_id"], schema=S)


def downgrade() -> None:
    op.drop_index("reconciliation_runs_dag_run_id_idx", table_name="reconciliation_runs", schema=S)
    op.drop_column("reconciliation_runs", "dag_run_id", schema=S)
    op.drop_index("manual_review_open_reason_idx", table_name="manual_review", schema=S)
    op.drop_index("manual_review_open_queue_idx", table_name="manual_review", schema=S)
