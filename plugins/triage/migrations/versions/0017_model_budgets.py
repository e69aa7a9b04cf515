"""Requests-per-minute and tokens-per-minute budgets of a model connection, shared by every worker;
and the provider batches a backfill's jobs wait on.

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

``model_batches``: one row per set of jobs submitted to the provider's batch interface, keyed by
the submission's name (written before the provider is asked, so a resubmission after a crash
adopts the provider's batch instead of paying twice), with its provider id, state and jobs.
``model_batch_answers``: one row per job and attempt a batch answered (what the model said, or
the error class of its failed request); the classify step takes a job's answer from here instead
of calling the model.

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql as pg

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
    op.create_table(
        "model_batches",
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("batch_key", sa.Text, nullable=False),
        sa.Column("classifier_version", sa.Text, nullable=False),
        sa.Column("provider_batch_id", sa.Text),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'submitting'")),
        sa.Column("job_ids", pg.ARRAY(pg.UUID(as_uuid=True)), nullable=False),
        sa.Column("attempts", pg.ARRAY(sa.Integer), nullable=False),
        sa.Column("submitted_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.Column("finished_at", sa.DateTime(timezone=True)),
        sa.PrimaryKeyConstraint("key", name="model_batches_pkey"),
        sa.CheckConstraint(
            "status IN ('submitting', 'running', 'collected', 'lost')", name="model_batches_status_check"
        ),
        schema=S,
        comment="A set of jobs submitted to the provider's batch interface, and what became of it",
    )
    op.create_index(
        "model_batches_open_idx",
        "model_batches",
        ["batch_key"],
        schema=S,
        postgresql_where=sa.text("status IN ('submitting', 'running')"),
    )
    op.create_table(
        "model_batch_answers",
        sa.Column("job_id", pg.UUID(as_uuid=True), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("batch", sa.Text, nullable=False),
        sa.Column("label", sa.Text),
        sa.Column("confidence", sa.Float),
        sa.Column("rejected_reason", sa.Text),
        sa.Column("output_mode", sa.Text),
        sa.Column("prompt_tokens", sa.Integer),
        sa.Column("completion_tokens", sa.Integer),
        sa.Column("error_class", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=now),
        sa.PrimaryKeyConstraint("job_id", "attempt", name="model_batch_answers_pkey"),
        sa.ForeignKeyConstraint(["batch"], [f"{S}.model_batches.key"], name="model_batch_answers_batch_fkey"),
        schema=S,
        comment="A job's answer from a provider batch, taken by the classify step instead of a call",
    )
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {S}.model_batches TO {APP}")
    op.execute(f"GRANT SELECT, INSERT, UPDATE ON {S}.model_batch_answers TO {APP}")


def downgrade() -> None:
    op.execute(f"DROP TABLE IF EXISTS {S}.model_batch_answers")
    op.execute(f"DROP TABLE IF EXISTS {S}.model_batches")
    op.execute(f"DROP TABLE IF EXISTS {S}.model_budgets")
