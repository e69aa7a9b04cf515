"""The reconciliation report's read-only questions of the ledger, as named SQLAlchemy Core
statements: counts by state and step, queue ages, time in state, attempts, retry reasons, the
review queue, schema mismatches and rejected outputs. Windowed (``:window`` seconds) where the
history grows without bound. Nothing here writes; the checks are :mod:`triage.jobs.sql.reads.checks`.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import ARRIVED_UNSUPPORTED, classifications, job_events, jobs, manual_review
from triage.jobs.sql.expressions import NOW, status_literal
from triage.jobs.sql.expressions import seconds_param as seconds
from triage.jobs.sql.reads.checks import age_seconds, entered_at
from triage.jobs.vocabulary.states import OPEN, TERMINAL, Step
from triage.jobs.vocabulary.states import JobStatus as S


def _window() -> ColumnElement[Any]:
    return NOW - seconds("window")


def reported() -> ColumnElement[bool]:
    """The jobs a report counts: every open job, and the jobs that finished within the window
    (``jobs_open_idx``, ``jobs_terminal_recent_idx``). Never the whole history: every 15
    minutes, at ten million jobs, that would be most of the run."""
    return sa.or_(
        jobs.c.status.in_([status_literal(s) for s in sorted(OPEN)]),
        sa.and_(jobs.c.status.in_([status_literal(s) for s in sorted(TERMINAL)]), jobs.c.updated_at >= _window()),
    )


@cache
def counts_by_state_step_and_attempt() -> sa.Select[Any]:
    """Jobs by state, step and attempt: the open ones, and those finished in the window
    (:func:`reported`). One pass serves both the counts by state and step and the attempts
    histogram, which read the same rows of the heap twice before."""
    return (
        sa.select(jobs.c.status, jobs.c.step, jobs.c.attempt, sa.func.count().label("n"))
        .where(reported())
        .group_by(jobs.c.status, jobs.c.step, jobs.c.attempt)
        .order_by(jobs.c.status, jobs.c.step, jobs.c.attempt)
    )


@cache
def oldest_per_state() -> sa.Select[Any]:
    """The queue age of each open state: how long its oldest job has been in it."""
    rows = (
        sa.select(jobs.c.status, entered_at().label("since"))
        .where(jobs.c.status.in_([status_literal(s) for s in sorted(OPEN)]))
        .subquery()
    )
    return (
        sa.select(rows.c.status, sa.func.count().label("n"), sa.func.max(age_seconds(rows.c.since)).label("oldest"))
        .group_by(rows.c.status)
        .order_by(rows.c.status)
    )


@cache
def time_in_state() -> sa.Select[Any]:
    """Median and p95 seconds a job stayed in each state before its next transition, over the
    transitions of the window (``:window`` seconds)."""
    spans = (
        sa.select(
            job_events.c.to_status.label("status"),
            sa.func.extract(
                "epoch",
                sa.func.lead(job_events.c.at).over(partition_by=job_events.c.job_id, order_by=job_events.c.id)
                - job_events.c.at,
            ).label("seconds"),
        )
        .where(job_events.c.at >= _window())
        .subquery()
    )
    return (
        sa.select(
            spans.c.status,
            sa.func.count().label("n"),
            sa.func.percentile_cont(0.5).within_group(spans.c.seconds).label("median"),
            sa.func.percentile_cont(0.95).within_group(spans.c.seconds).label("p95"),
        )
        .where(spans.c.seconds.is_not(None))
        .group_by(spans.c.status)
        .order_by(spans.c.status)
    )


@cache
def retry_reasons() -> Any:
    """Error classes of the window's moves into ``retryable_failed``."""
    return (
        sa.select(sa.func.coalesce(job_events.c.reason, "unknown").label("reason"), sa.func.count().label("n"))
        .where(job_events.c.to_status == S.RETRYABLE_FAILED.value, job_events.c.at >= _window())
        .group_by(sa.text("1"))
        .order_by(sa.desc("n"), sa.text("1"))
    )


@cache
def review_queue() -> sa.Select[Any]:
    """Open reviews, oldest first (``:limit`` rows), with the job's attempts and last error class."""
    return (
        sa.select(
            manual_review.c.job_id,
            jobs.c.batch_key,
            manual_review.c.reason,
            jobs.c.attempt.label("attempts"),
            jobs.c.last_error_class,
            age_seconds(manual_review.c.created_at).label("age_seconds"),
            sa.func.count().over().label("total"),
        )
        .join_from(manual_review, jobs, jobs.c.id == manual_review.c.job_id)
        .where(manual_review.c.resolved_at.is_(None))
        .order_by(manual_review.c.created_at, manual_review.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )


UNSUPPORTED = "unsupported_schema_version"


@cache
def schema_mismatches() -> sa.Select[Any]:
    """Jobs routed as ``unsupported_schema_version``: by the classify step (a transition with
    that reason) or on arrival (a review row whose context names it), with their state now.

    Both conditions are written as the partial indexes' predicates (``job_events_unsupported_idx``,
    ``manual_review_unsupported_idx``, migration 0020), as constants, so that the planner reads
    only those rows: every retained transition and every review row ever written, otherwise."""
    by_step = sa.select(job_events.c.job_id, sa.literal(Step.CLASSIFY.value).label("found_by")).where(
        job_events.c.reason == sa.literal_column(f"'{UNSUPPORTED}'")
    )
    on_arrival = sa.select(manual_review.c.job_id, sa.literal("retrieval").label("found_by")).where(
        sa.text(ARRIVED_UNSUPPORTED)
    )
    routed = sa.union(by_step, on_arrival).subquery()
    return (
        sa.select(routed.c.found_by, jobs.c.status, sa.func.count(sa.distinct(jobs.c.id)).label("n"))
        .join_from(routed, jobs, jobs.c.id == routed.c.job_id)
        .group_by(routed.c.found_by, jobs.c.status)
        .order_by(routed.c.found_by, jobs.c.status)
    )


@cache
def rejected_outputs() -> Any:
    """Model outputs refused by validation in the window, by ``rejected_reason``."""
    return (
        sa.select(
            sa.func.coalesce(classifications.c.rejected_reason, "unspecified").label("reason"),
            sa.func.count().label("n"),
        )
        # The outcome as a constant: ``classifications_rejected_idx`` (0020) holds only these rows.
        .where(classifications.c.outcome == sa.literal_column("'rejected'"), classifications.c.created_at >= _window())
        .group_by(sa.text("1"))
        .order_by(sa.desc("n"), sa.text("1"))
    )
