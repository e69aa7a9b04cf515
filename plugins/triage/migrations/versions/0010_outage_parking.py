"""A job whose dependency is down is parked in ``waiting`` until a time, not failed.

Revision ID: 0010
Revises: 0007
Create Date: 2026-12-01

An outage (the model answering 5xx or timing out for every call, the payload store gone) is
not a job's failure: it must neither spend the job's attempts nor send it to manual review.
The classify step now parks the batch's unfinished jobs in ``waiting`` (``status_reason``
``outage:<dependency>``) with ``next_attempt_at`` set to when the dependency may be back, and a
claim of the batch queues them again once that time has passed. Two moves are new, since the
jobs of a batch nobody has claimed yet are parked too: ``queued -> waiting`` and
``retryable_failed -> waiting``. ``next_attempt_at`` is now allowed while ``waiting`` (and still
required while ``retryable_failed``).

Frozen history: this file states the change as it is made here and imports nothing of the
current code.
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

S = "triage"
NEW_TRANSITIONS = (("queued", "waiting"), ("retryable_failed", "waiting"))
OLD_CHECK = "jobs_next_attempt_only_while_retryable_check"
NEW_CHECK = "jobs_next_attempt_only_while_retryable_or_parked_check"


def _transitions(sql: str) -> None:
    # job_transitions refuses every change by trigger; a migration lifts it for its own write.
    op.execute(f"ALTER TABLE {S}.job_transitions DISABLE TRIGGER job_transitions_frozen")
    op.execute(sql)
    op.execute(f"ALTER TABLE {S}.job_transitions ENABLE TRIGGER job_transitions_frozen")


def upgrade() -> None:
    rows = ", ".join(f"('{a}', '{b}')" for a, b in NEW_TRANSITIONS)
    _transitions(f"INSERT INTO {S}.job_transitions (from_status, to_status) VALUES {rows}")
    op.drop_constraint(OLD_CHECK, "jobs", schema=S)
    op.create_check_constraint(
        op.f(NEW_CHECK),
        "jobs",
        "(status = 'retryable_failed' AND next_attempt_at IS NOT NULL) OR status = 'waiting'"
        " OR (status NOT IN ('retryable_failed', 'waiting') AND next_attempt_at IS NULL)",
        schema=S,
    )


def downgrade() -> None:
    # Parked jobs cannot stay parked under the old rules: they go back to the queue.
    op.execute(
        f"UPDATE {S}.jobs SET status = 'queued', status_reason = 'unparked', next_attempt_at = NULL"
        " WHERE status = 'waiting' AND status_reason LIKE 'outage:%'"
    )
    op.drop_constraint(NEW_CHECK, "jobs", schema=S)
    op.create_check_constraint(
        op.f(OLD_CHECK), "jobs", "(status = 'retryable_failed') = (next_attempt_at IS NOT NULL)", schema=S
    )
    pairs = " OR ".join(f"(from_status = '{a}' AND to_status = '{b}')" for a, b in NEW_TRANSITIONS)
    _transitions(f"DELETE FROM {S}.job_transitions WHERE {pairs}")
