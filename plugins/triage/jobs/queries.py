"""Read-only questions the store asks the ledger, as named SQLAlchemy Core statements: what a
fence saw, what a step still owes, what persistence writes, why a review decision matched
nothing, and the open reviews.

Nothing here writes, and nothing executes anything: :mod:`triage.jobs.store` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.audit_samples import awaits_decision
from triage.jobs.expressions import NOW, UUID, in_version, latest_answer, status_literal
from triage.jobs.schema import classifications, jobs, manual_review
from triage.jobs.states import UNFINISHED
from triage.jobs.states import JobStatus as S


@cache
def describe_jobs() -> Any:
    """What the fence saw, for the jobs a write missed: to name the error."""
    return sa.select(
        jobs.c.id, jobs.c.status, jobs.c.attempt, jobs.c.lease_token, (jobs.c.lease_expires_at > NOW).label("in_time")
    ).where(jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))))


@cache
def next_due() -> Any:
    """When the earliest retryable job of a batch and step (of ``:p_classifier_version``, when
    given: the jobs this step may claim) may be claimed again."""
    return sa.select(sa.func.min(jobs.c.next_attempt_at), sa.func.now()).where(
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        jobs.c.status == status_literal(S.RETRYABLE_FAILED),
        jobs.c.attempt < jobs.c.max_attempts,
        in_version(),
    )


@cache
def open_in_step() -> Any:
    """How many jobs of a batch and step (of ``:p_classifier_version``, when given) an
    automatic step still owes work to."""
    return sa.select(sa.func.count()).where(
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        jobs.c.status.in_([status_literal(s) for s in sorted(UNFINISHED)]),
        in_version(),
    )


@cache
def accepted_classifications() -> Any:
    """The latest accepted classification of each given job: what persistence writes."""
    return (
        sa.select(
            classifications.c.job_id,
            classifications.c.label,
            classifications.c.confidence,
            classifications.c.classifier_version,
        )
        .where(
            classifications.c.job_id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))),
            classifications.c.outcome == "accepted",
        )
        .distinct(classifications.c.job_id)  # DISTINCT ON; SQLAlchemy 2.0 has no .ext(distinct_on)
        .order_by(classifications.c.job_id, classifications.c.attempt.desc())
    )


def latest_review() -> Any:
    """The latest review row of the job in scope (``jobs``), as a LATERAL subquery: its id,
    resolution, reviewer, when, and the label a reviewer resolved it with (``resolved_label``)."""
    return (
        sa.select(
            manual_review.c.id,
            manual_review.c.reason,
            manual_review.c.resolution,
            manual_review.c.resolved_by,
            manual_review.c.resolved_at,
            manual_review.c.context["resolved_label"].astext.label("resolved_label"),
        )
        .where(manual_review.c.job_id == jobs.c.id)
        .order_by(manual_review.c.id.desc())
        .limit(1)
        .lateral("latest_review")
    )


@cache
def review_state() -> Any:
    """A job's state and its latest review row: why a decision matched nothing (unknown job,
    not in review, already decided the same way or otherwise, replays spent)."""
    latest = latest_review()
    return (
        sa.select(
            jobs.c.status,
            jobs.c.replays,
            latest.c.reason,
            latest.c.resolution,
            latest.c.resolved_by,
            latest.c.resolved_at,
            latest.c.resolved_label,
        )
        .select_from(jobs)
        .outerjoin(latest, sa.true())
        .where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID))
    )


@cache
def open_review_cases() -> Any:
    """Open reviews, oldest first, with what a reviewer needs to decide: the job's ids and
    references, why it is here, and the model's latest label and confidence. Never the document.

    ``:ids`` NULL: every open review (up to ``:limit``)."""
    model = latest_answer()
    ids = sa.bindparam("ids", type_=pg.ARRAY(UUID))
    return (
        sa.select(
            jobs.c.id.label("job_id"),
            jobs.c.correlation_id,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.payload_ref,
            jobs.c.classifier_version,
            jobs.c.batch_key,
            jobs.c.step,
            jobs.c.attempt,
            jobs.c.max_attempts,
            jobs.c.replays,
            jobs.c.attempt_base,
            manual_review.c.reason,
            manual_review.c.error_class,
            manual_review.c.last_error,
            manual_review.c.context,
            manual_review.c.created_at.label("opened_at"),
            model.c.label.label("model_label"),
            model.c.confidence.label("model_confidence"),
            model.c.outcome.label("model_outcome"),
        )
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .outerjoin(model, sa.true())
        .where(
            manual_review.c.resolved_at.is_(None),
            awaits_decision(),
            sa.or_(ids.is_(None), jobs.c.id == sa.any_(ids)),
        )
        .order_by(manual_review.c.created_at, manual_review.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
    )
