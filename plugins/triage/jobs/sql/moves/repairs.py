"""Reconciliation's repairs, as named, fenced SQLAlchemy Core statements of the ledger.

Each repair's WHERE clause is the whole condition that makes it certain: the very condition
the matching check of :mod:`triage.jobs.sql.reads.checks` counts (shared from there, with its ``:grace`` or
``:threshold``): ``UPDATE … WHERE <expected state> … RETURNING`` or ``INSERT … SELECT … WHERE
NOT EXISTS …``. A job that moved on since the check is simply not matched, and the ids
returned are exactly what changed. State changes go through the transitions the database
allows, with a ``status_reason`` the trigger logs in ``job_events`` under the actor
:data:`~triage.jobs.vocabulary.models.REPAIRER`.

:class:`~triage.jobs.store.JobStore` runs each in a transaction of its own under :func:`lock`,
so that two reconcilers never insert the same missing row twice.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import classifications, jobs, manual_review, outbox
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import (
    EVENT_COLUMNS,
    MOVED,
    NOW,
    outbox_insert,
    review_rows,
    seconds_param,
    status_literal,
)
from triage.jobs.sql.reads import checks as C
from triage.jobs.vocabulary.models import REPAIRER
from triage.jobs.vocabulary.states import TERMINAL, EventType
from triage.jobs.vocabulary.states import JobStatus as S

MISSING_REVIEW = "reconciliation_missing_review"
ORPHANED = "orphaned"
LOCK_KEY = 0x7472_6961_6765  # "triage": one advisory lock for every reconciler's repairs


@cache
def lock() -> Any:
    """Serialise repairs across reconcilers for the rest of the transaction."""
    return sa.select(sa.func.pg_advisory_xact_lock(LOCK_KEY))


@cache
def queue_stuck_received() -> Any:
    """``received -> queued`` for jobs received more than ``:threshold`` seconds ago, with the
    ``job.registered`` event that ``queued`` promises (unless the job has one already)."""
    moved = (
        sa.update(jobs)
        .where(jobs.c.status == status_literal(S.RECEIVED), jobs.c.updated_at < NOW - seconds_param("threshold"))
        .values(status=status_literal(S.QUEUED), status_reason="reconciliation_queued", updated_at=NOW)
        .returning(*EVENT_COLUMNS)
        .cte("moved")
    )
    has_event = sa.exists().where(outbox.c.job_id == moved.c.id, outbox.c.event_type == EventType.REGISTERED.value)
    missing = sa.select(moved).where(~has_event).cte("missing")
    return sa.select(moved.c.id).add_cte(outbox_insert(missing, EventType.REGISTERED).cte("events"))


@cache
def send_spent_retries_to_review() -> Any:
    """``retryable_failed -> manual_review`` (``retries_exhausted``) for jobs whose attempts are
    spent, with their review row: what ``retry_later`` does for a job at its last attempt."""
    moved = (
        sa.update(jobs)
        .where(*C.spent_retryable())
        .values(
            status=status_literal(S.MANUAL_REVIEW),
            status_reason="retries_exhausted",
            next_attempt_at=None,
            updated_at=NOW,
        )
        .returning(*MOVED)
        .cte("moved")
    )
    context = sa.func.jsonb_build_object("repaired_by", REPAIRER, "retryable", True)
    cases = E.entered_review(moved, sa.literal("retries_exhausted"), context)
    return sa.select(moved.c.id).add_cte(*cases)


@cache
def open_missing_reviews() -> Any:
    """The open review row of jobs in ``manual_review`` that have none (a lost write): reason
    ``reconciliation_missing_review``; the job's own ``status_reason`` goes into the context."""
    rows = sa.select(*MOVED).where(*C.in_review_without_row()).cte("rows")
    context = sa.func.jsonb_build_object("repaired_by", REPAIRER, "status_reason", rows.c.status_reason)
    return review_rows(rows, sa.literal(MISSING_REVIEW), context).returning(manual_review.c.job_id)


@cache
def supersede_reviews_of_terminal_jobs() -> Any:
    """Resolve as ``superseded`` the open review rows of jobs that are already terminal
    (``completed`` or ``terminal_failed``): no decision can apply to them any more."""
    return (
        sa.update(manual_review)
        .where(*C.open_review_of_job_in(*TERMINAL))
        .values(
            resolved_at=NOW,
            resolution="superseded",
            resolved_by=REPAIRER,
            note=sa.func.concat("the job was already ", jobs.c.status, " (reconciliation)"),
        )
        .returning(manual_review.c.job_id)
    )


@cache
def append_missing_completion_events() -> Any:
    """The ``job.completed`` event of completed jobs that have no completion event, with the
    label of the job's latest accepted classification when it has one (a reviewer's label,
    which has no classification, is not restated: the event carries ``{}``)."""
    answer = (
        sa.select(classifications.c.label, classifications.c.confidence, classifications.c.classifier_version)
        .where(
            classifications.c.job_id == jobs.c.id,
            classifications.c.attempt <= jobs.c.attempt,
            classifications.c.outcome == "accepted",
        )
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("answer")
    )
    rows = (
        sa.select(*EVENT_COLUMNS, answer.c.label, answer.c.confidence, answer.c.classifier_version)
        .outerjoin(answer, sa.true())
        .where(*C.completed_without_completion_event())
        .cte("rows")
    )
    return outbox_insert(rows, EventType.COMPLETED, E.label_payload(rows)).returning(outbox.c.job_id)


@cache
def send_orphans_to_review() -> Any:
    """``queued``/``retryable_failed -> manual_review`` (``orphaned``, with the review row) for
    the claimable jobs of a batch nobody has worked on for ``:threshold`` seconds
    (:func:`~triage.jobs.sql.reads.checks.orphaned`). Not back to the queue: the jobs are claimable
    already, and the rule fires because no claim came; only a new run of the batch would take
    them, which a reviewer (or replay by reason ``orphaned``) starts knowingly."""
    moved = (
        sa.update(jobs)
        .where(*C.orphaned())
        .values(status=status_literal(S.MANUAL_REVIEW), status_reason=ORPHANED, next_attempt_at=None, updated_at=NOW)
        .returning(*MOVED)
        .cte("moved")
    )
    context = sa.func.jsonb_build_object(
        "repaired_by", REPAIRER, "orphaned", True, "threshold_seconds", sa.bindparam("threshold", type_=sa.Float)
    )
    cases = E.entered_review(moved, sa.literal(ORPHANED), context)
    return sa.select(moved.c.id).add_cte(*cases)
