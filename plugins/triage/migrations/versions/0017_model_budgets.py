"""Requests-per-minute and tokens-per-minute budgets of a model connection, shared by every worker.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01

``model_budgets``: one row per model connection (issue #17 item 2). Each model call takes its
slot with one ``UPDATE`` of the row (a generic cell rate: ``request_tat``/``token_tat`` move on by
the call's share of the minute), so Celery workers on several hosts draw from one budget; a 429
moves ``blocked_until`` (the provider's Retry-After or rate-limit reset) for everyone. The app
role reads, inserts and updates it (a worker writes its connection's configured rates).

``UNLOGGED``: a call's slot is not worth a WAL flush. A durable commit per call cost 11.7 ms at
load (one thread; 0.6 ms for a read), measured; the row is only a pacing state, and after a crash
(the table comes back empty) or on a promoted standby (unlogged tables are not replicated) the
next call's worker writes it again with a full budget.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"


def upgrade() -> None:
    now = sa.text("now()")
    op.create_table(
        "model_budgets",
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("requests_per_minute", sa.Float),
        sa.Column("tokens_per_minute", sa.Float),
        sa.Column("burst_seconds", sa.Float, nullable=False, server_default=sa.text("1")),
        sa.Column("request_tat", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("token_tat", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("blocked_until", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("'-infinity'")),
        sa.Column("rate_limited", sa.BigInteger, nullable=False, server_default=sa.text("0")),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("name", name="model_budgets_pkey"),
        sa.CheckConstraint(
            "requests_per_minute IS NULL OR requests_per_minute > 0", name="model_budgets_requests_per_minute_check"
        ),
        sa.CheckConstraint(
            "tokens_per_minute IS NULL OR tokens_per_minute > 0", name="model_budgets_tokens_per_minute_check"
        ),
        sa.CheckConstraint("burst_seconds >= 0", name="model_budgets_burst_seconds_check"),
        schema=S,
        comment="Requests and tokens per minute of a model connection, shared by every worker",
        prefixes=["UNLOGGED"],
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {S}.model_budgets TO {APP}")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {S}.model_budgets")
