"""The repairs reconciliation may make, as named, fenced SQLAlchemy Core statements.

Each states, in its own WHERE clause, the whole condition that makes the repair certain (the
same condition the matching check of :mod:`.queries` counts, with its ``:grace`` or
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

from triage.jobs.schema import jobs, manual_review, outbox
from triage.jobs.states import JobStatus as S
from triage.jobs.transitions import outbox_insert, status_literal
from triage.reconciliation.queries import COMPLETION_EVENTS, NOW, seconds

MISSING_REVIEW = "reconciliation_missing_review"
ACTOR = "reconciliation"
LOCK_KEY = 0x7472_6961_6765  # "triage": one advisory lock for every reconciler's repairs


def _settled() -> Any:
    """Not changed for ``:grace`` seconds: no writer is mid-way through this job."""
    return jobs.c.updated_at < NOW - seconds("grace")


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
        .where(jobs.c.status == status_literal(S.RETRYABLE_FAILED), jobs.c.attempt >= jobs.c.max_attempts, _settled())
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
    has_open = sa.exists().where(manual_review.c.job_id == jobs.c.id, manual_review.c.resolved_at.is_(None))
    rows = (
        sa.select(jobs.c.id, jobs.c.attempt, jobs.c.last_error_class, jobs.c.last_error, jobs.c.status_reason)
        .where(jobs.c.status == status_literal(S.MANUAL_REVIEW), _settled(), ~has_open)
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
        .where(
            manual_review.c.resolved_at.is_(None),
            manual_review.c.job_id == jobs.c.id,
            jobs.c.status.in_([status_literal(S.COMPLETED), status_literal(S.TERMINAL_FAILED)]),
            _settled(),
        )
        .values(resolved_at=NOW, resolution="superseded", resolved_by=ACTOR,
                note=sa.func.concat("the job was already ", jobs.c.status, " (reconciliation)"))
        .returning(manual_review.c.job_id)
    )  # fmt: skip


@cache
def append_completed_events() -> Any:
    """The ``job.completed`` event of completed jobs that have no completion event."""
    has_event = sa.exists().where(outbox.c.job_id == jobs.c.id, outbox.c.event_type.in_(COMPLETION_EVENTS))
    rows = sa.select(jobs.c.id, jobs.c.attempt).where(
        jobs.c.status == status_literal(S.COMPLETED), _settled(), ~has_event
    )
    return outbox_insert(rows.cte("rows"), "job.completed").returning(outbox.c.job_id)
