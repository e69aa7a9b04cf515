"""The repairs reconciliation may make, as named, fenced SQLAlchemy Core statements.

Each repair's WHERE clause is the whole condition that makes it certain: the very condition
the matching check of :mod:`.queries` counts (shared from there, with its ``:grace`` or
``:threshold``): ``UPDATE … WHERE <expected state> … RETURNING`` or ``INSERT … SELECT … WHERE
NOT EXISTS …``. A job that moved on since the check is simply not matched, and the ids
returned are exactly what changed. State changes go through
the transitions the database allows; the trigger logs them with actor ``reconciliation``.

Repairs run under :func:`lock` so that two reconcilers never insert the same missing row twice.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.expressions import outbox_insert, status_literal
from triage.jobs.schema import jobs, manual_review, outbox
from triage.jobs.states import JobStatus as S
from triage.reconciliation import queries as Q
from triage.reconciliation.queries import NOW, seconds

MISSING_REVIEW = "reconciliation_missing_review"
ACTOR = "reconciliation"
LOCK_KEY = 0x7472_6961_6765  # "triage": one advisory lock for every reconciler's repairs


@cache
def lock() -> Any:
    """Serialise repairs across reconcilers for the rest of the transaction."""
    return sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY))


@cache
def queue_received() -> Any:
    """``received -> queued`` for jobs received more than ``:threshold`` seconds ago, with the
    ``job.registered`` event that ``queued`` promises (unless the job has one already)."""
    moved = (
        sa.update(jobs)
        .where(jobs.c.status == status_literal(S.RECEIVED), jobs.c.updated_at < NOW - seconds("threshold"))
        .values(status=status_literal(S.QUEUED), status_reason="reconciliation_queued", updated_at=NOW)
        .returning(jobs.c.id, jobs.c.attempt)
        .cte("moved")
    )
    has_event = sa.exists().where(outbox.c.job_id == moved.c.id, outbox.c.event_type == "job.registered")
    missing = sa.select(moved.c.id, moved.c.attempt).where(~has_event).cte("missing")
    return sa.select(moved.c.id).add_cte(outbox_insert(missing, "job.registered").cte("events"))


def _review_insert(rows: Any, reason: Any, context: Any) -> Any:
    return (
        pg.insert(manual_review)
        .from_select(
            ["job_id", "reason", "error_class", "attempts", "last_error", "context"],
            sa.select(rows.c.id, reason, rows.c.last_error_class, rows.c.attempt, rows.c.last_error, context),
        )
        .on_conflict_do_nothing(index_elements=["job_id"], index_where=manual_review.c.resolved_at.is_(None))
    )


@cache
def exhaust_unclaimable() -> Any:
    """``retryable_failed -> manual_review`` (``retries_exhausted``) for jobs whose attempts are
    spent, with their review row: what ``retry_later`` does for a job at its last attempt."""
    moved = (
        sa.update(jobs)
        .where(*Q.spent_retryable())
        .values(status=status_literal(S.MANUAL_REVIEW), status_reason="retries_exhausted", next_attempt_at=None,
                updated_at=NOW)
        .returning(jobs.c.id, jobs.c.attempt, jobs.c.last_error_class, jobs.c.last_error)
        .cte("moved")
    )  # fmt: skip
    context = sa.func.jsonb_build_object("repaired_by", ACTOR, "retryable", True)
    reviews = _review_insert(moved, sa.literal("retries_exhausted"), context).cte("reviews")
    return sa.select(moved.c.id).add_cte(reviews)


@cache
def insert_missing_reviews() -> Any:
    """The open review row of jobs in ``manual_review`` that have none (a lost write): reason
    ``reconciliation_missing_review``; the job's own ``status_reason`` goes into the context."""
    rows = (
        sa.select(jobs.c.id, jobs.c.attempt, jobs.c.last_error_class, jobs.c.last_error, jobs.c.status_reason)
        .where(*Q.in_review_without_row())
        .cte("rows")
    )
    context = sa.func.jsonb_build_object("repaired_by", ACTOR, "status_reason", rows.c.status_reason)
    return _review_insert(rows, sa.literal(MISSING_REVIEW), context).returning(manual_review.c.job_id)


@cache
def supersede_stale_reviews() -> Any:
    """Resolve as ``superseded`` the open review rows of jobs that are already terminal
    (``completed`` or ``terminal_failed``): no decision can apply to them any more."""
    return (
        sa.update(manual_review)
        .where(*Q.open_review_of_job_in(*Q.TERMINAL_STATES))
        .values(resolved_at=NOW, resolution="superseded", resolved_by=ACTOR,
                note=sa.func.concat("the job was already ", jobs.c.status, " (reconciliation)"))
        .returning(manual_review.c.job_id)
    )  # fmt: skip


@cache
def append_completed_events() -> Any:
    """The ``job.completed`` event of completed jobs that have no completion event."""
    rows = sa.select(jobs.c.id, jobs.c.attempt).where(*Q.completed_without_completion_event())
    return outbox_insert(rows.cte("rows"), "job.completed").returning(outbox.c.job_id)
