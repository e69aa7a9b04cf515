"""A job's attempts only grow; each budget starts at ``attempt_base``. Usage figures a model
reported out of range are named in ``classifications.usage_discarded``.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

Until now a requeue from review (and an advance to the next step) reset ``attempt`` to 0: the
next attempt reused an attempt number, its classification hit ``ON CONFLICT (job_id, attempt)
DO NOTHING`` and was lost, and the log showed attempt 1 twice. Now ``attempt`` counts every
attempt of the job's life and ``max_attempts`` is the last attempt the current budget allows;
``attempt_base`` is where that budget began (0 at registration, the attempt of the latest
advance or requeue), so a budget's size is ``max_attempts - attempt_base`` and the attempt
within it ``attempt - attempt_base``. Every row before this revision started its budget at 0
(the reset made it so): the default is right for all of them.

``usage_discarded``: the usage figures (tokens, cost) a model reported outside what the columns
hold (negative, 2^31 tokens or more, a cost of 10^6 or more, not a number) are stored as NULL
and named here, so one bad figure never fails the batch that records it.

Frozen history: this file states the schema as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

S = "triage"
BOUNDS = "jobs_attempt_bounds_check"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("attempt_base", sa.Integer, nullable=False, server_default=sa.text("0")), schema=S)
    op.drop_constraint(op.f(BOUNDS), "jobs", schema=S)
    op.create_check_constraint(
        op.f(BOUNDS), "jobs", "attempt_base >= 0 AND attempt >= attempt_base AND attempt <= max_attempts", schema=S
    )
    op.add_column("classifications", sa.Column("usage_discarded", sa.Text), schema=S)


def downgrade() -> None:
    op.drop_column("classifications", "usage_discarded", schema=S)
    op.drop_constraint(op.f(BOUNDS), "jobs", schema=S)
    op.create_check_constraint(op.f(BOUNDS), "jobs", "attempt >= 0 AND attempt <= max_attempts", schema=S)
    op.drop_column("jobs", "attempt_base", schema=S)
