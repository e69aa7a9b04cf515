"""Moves of an outage, as named SQLAlchemy Core statements: park a batch's unstarted work in
``waiting`` while a dependency is down, and queue it again once it is due.

A job parked on an outage is ``waiting`` with ``status_reason`` ``outage:<dependency>``
(:data:`~triage.jobs.vocabulary.states.OUTAGE_PREFIX`) and ``next_attempt_at`` set: not the job's failure,
so its attempts are untouched, the failure callback leaves it alone
(:func:`triage.jobs.sql.moves.recovery.send_batch_to_review`) and only a claim of its batch and step (the
next try, the next run of its date) takes it up again. The parking of a claimed job is an
attempt's outcome (:func:`triage.jobs.sql.moves.worker.park`). Nothing here executes anything.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import job_events, jobs
from triage.jobs.sql.expressions import NOW, UUID, in_version, parked, recordset, status_literal
from triage.jobs.vocabulary.states import OUTAGE_PREFIX
from triage.jobs.vocabulary.states import JobStatus as S

MAX_OUTAGE_BACKOFF_SECONDS = 3600.0
"""The longest a job is parked on an outage by the backoff (a ``Retry-After`` is the model's own
and is not grown): a dependency that stays down for a day is tried about once an hour per batch."""


def outage_due(delay: ColumnElement[Any], backoff: ColumnElement[Any]) -> ColumnElement[Any]:
    """When a job parked on an outage now is due: ``now + delay``, and with ``backoff`` the delay
    doubled for each time the job was parked on an outage before (its ``job_events``), at most
    :data:`MAX_OUTAGE_BACKOFF_SECONDS`. Every try, resumed run and reconciliation's resume that
    finds the dependency still down parks the jobs again, so the tries thin out on their own:
    30 s, 1, 2, 4 min (a run's Airflow retries, whose delays double alike), then 8, 16, 32 min,
    1 h (the resumes ``reconcile_jobs`` makes once the jobs are due)."""
    earlier = (
        sa.select(sa.func.count())
        .where(
            job_events.c.job_id == jobs.c.id,
            job_events.c.to_status == status_literal(S.WAITING),
            sa.func.starts_with(job_events.c.reason, OUTAGE_PREFIX),
        )
        .scalar_subquery()
    )
    grown = sa.func.least(delay * sa.func.power(2, sa.func.least(earlier, 16)), MAX_OUTAGE_BACKOFF_SECONDS)
    seconds = sa.case((backoff, grown), else_=delay)
    return NOW + sa.func.make_interval(0, 0, 0, 0, 0, 0, seconds)


def _in_step() -> list[ColumnElement[bool]]:
    return [
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        in_version(),
    ]


@cache
def park_unstarted() -> Any:
    """``queued``/``retryable_failed -> waiting`` (reason ``outage:<:dependency>``) for the jobs of
    a batch and step that no claim holds, due at ``now + :delay_seconds`` (grown by
    :func:`outage_due` with ``:backoff``; a retryable job keeps its own later due time). The step parks them when it stops on an outage, so that the failed
    task's callback finds nothing of the outage to send to review.

    ``given_rows`` (:func:`~triage.jobs.sql.expressions.rowset` of id, attempt) names the retryable
    jobs whose latest attempt failed on the outage itself, in this try's batches before the
    circuit opened: they get that attempt back (fenced on it). Other attempts are untouched."""
    until = outage_due(sa.bindparam("delay_seconds", type_=sa.Float), sa.bindparam("backoff", type_=sa.Boolean))
    given = recordset("given", id=UUID, attempt=sa.Integer)
    outage_retry = sa.exists(sa.select(given.c.id).where(given.c.id == jobs.c.id, given.c.attempt == jobs.c.attempt))
    give_back = sa.and_(jobs.c.status == status_literal(S.RETRYABLE_FAILED), outage_retry)
    target = (
        sa.select(jobs.c.id)
        .where(*_in_step(), jobs.c.status.in_([status_literal(S.QUEUED), status_literal(S.RETRYABLE_FAILED)]))
        .with_for_update(skip_locked=True)
        .cte("target")
    )
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == target.c.id, jobs.c.status.in_([status_literal(S.QUEUED), status_literal(S.RETRYABLE_FAILED)])
        )
        .values(
            status=status_literal(S.WAITING),
            status_reason=sa.func.concat(OUTAGE_PREFIX, sa.bindparam("dependency", type_=sa.Text)),
            attempt=jobs.c.attempt - sa.case((give_back, 1), else_=0),
            next_attempt_at=sa.func.greatest(sa.func.coalesce(jobs.c.next_attempt_at, until), until),
            last_error_class=sa.bindparam("error_class", type_=sa.Text),
            last_error=sa.bindparam("error", type_=sa.Text),
            updated_at=NOW,
        )
        .returning(jobs.c.id)
    )


@cache
def resume_parked() -> Any:
    """``waiting -> queued`` for the jobs of a batch and step parked on an outage whose
    ``next_attempt_at`` has passed (reason ``resumed``): a claim takes them as any queued job."""
    target = (
        sa.select(jobs.c.id)
        .where(*_in_step(), parked(), jobs.c.next_attempt_at <= NOW)
        .with_for_update(skip_locked=True)
        .cte("target")
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == target.c.id, parked())
        .values(status=status_literal(S.QUEUED), status_reason="resumed", next_attempt_at=None, updated_at=NOW)
        .returning(jobs.c.id)
    )


@cache
def next_parked_due() -> Any:
    """When the earliest parked job of a batch and step is due, and the database's now."""
    return sa.select(sa.func.min(jobs.c.next_attempt_at), NOW).where(*_in_step(), parked())


BATCH_REASON = f"{OUTAGE_PREFIX}batch"
"""The ``status_reason`` of a job waiting on a provider batch (:mod:`triage.jobs.store.batches`)."""


@cache
def make_batch_due() -> Any:
    """The jobs ``:ids`` of a provider batch that was collected or lost, still parked on it
    (``waiting``, :data:`BATCH_REASON`), made due now: the next claim of their step queues them
    and takes each one's answer, or asks the model again. Returns the ids made due."""
    return (
        sa.update(jobs)
        .where(
            jobs.c.id.in_(sa.bindparam("ids", expanding=True)),
            jobs.c.status == "waiting",
            jobs.c.status_reason == BATCH_REASON,
        )
        .values(next_attempt_at=sa.func.now())
        .returning(jobs.c.id)
    )
