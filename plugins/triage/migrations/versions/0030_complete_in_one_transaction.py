"""A queued job may be completed in the transaction that picks it: ``queued -> completed``.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-05

Issue #29 ("count and cut the writes per document"): an in-process classifier (keyword,
learned: microseconds a document) picks a chunk of queued jobs ``FOR UPDATE SKIP LOCKED``,
classifies them and completes them in that one transaction (:mod:`triage.pipeline.one_transaction`;
``docs/adr/0009-claim-classify-complete-in-one-transaction.md``). The row lock is the chunk's ownership and the
transaction its lease: a crash rolls the whole chunk back. No ``running`` version of the job is
ever written, so the move the database sees is ``queued -> completed`` (or ``queued ->
manual_review``, which the failure callback already makes).

- ``job_transitions``: ``(queued, completed)``;
- ``transition_roles``: owned by ``triage_app`` (the pipeline's role), like ``running -> completed``.

Frozen history: this file states the change as made here and imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
FROZEN_TRANSITIONS = "job_transitions_frozen"
FROZEN_ROLES = "transition_roles_frozen"


def _frozen_rows(statement_transitions: str, statement_roles: str) -> None:
    for table, trigger, statement in (
        ("job_transitions", FROZEN_TRANSITIONS, statement_transitions),
        ("transition_roles", FROZEN_ROLES, statement_roles),
    ):
        op.execute(f"ALTER TABLE {S}.{table} DISABLE TRIGGER {trigger}")
        op.execute(statement)
        op.execute(f"ALTER TABLE {S}.{table} ENABLE TRIGGER {trigger}")


def upgrade() -> None:
    _frozen_rows(
        f"INSERT INTO {S}.job_transitions (from_status, to_status) VALUES ('queued', 'completed')",
        f"INSERT INTO {S}.transition_roles (from_status, to_status, role) VALUES ('queued', 'completed', '{APP}')",
    )


def downgrade() -> None:
    # A job completed that way stays completed: its row and its log are history, not a move to undo.
    _frozen_rows(
        f"DELETE FROM {S}.job_transitions WHERE from_status = 'queued' AND to_status = 'completed'",
        f"DELETE FROM {S}.transition_roles WHERE from_status = 'queued' AND to_status = 'completed'",
    )
