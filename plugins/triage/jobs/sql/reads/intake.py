"""Intake's reads of the ledger: the job of each key, the work a batch holds, where one job is.

Nothing here executes anything: intake's part of the store (:mod:`triage.jobs.store.intake`) runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import classifications, document_labels, jobs, manual_review
from triage.jobs.sql.expressions import UUID, status_literal
from triage.jobs.vocabulary.states import UNFINISHED


@cache
def jobs_by_key() -> Any:
    """The job of each idempotency key (the unique index on ``idempotency_key`` serves it)."""
    return sa.select(jobs.c.idempotency_key, jobs.c.id, jobs.c.status, jobs.c.correlation_id).where(
        jobs.c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
    )


@cache
def unfinished_depth() -> Any:
    """How many jobs of a batch are unfinished (``received``, ``queued``, ``running``,
    ``waiting``, ``retryable_failed``: :data:`~triage.jobs.vocabulary.states.UNFINISHED`, whatever their
    step), counted up to ``:bound`` only (the backpressure check needs no more). Parked work
    counts: a model outage parks intake's jobs in ``waiting``, and a depth of queued jobs alone
    let every outage cycle take another bound's worth (issue #25). One scan of the batch's
    entries of ``jobs_batch_key_status_idx`` that stops after ``bound``, whatever the table holds
    (tests/ledger/test_intake.py reads the plan)."""
    unfinished = (
        sa.select(sa.literal(1))
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            jobs.c.status.in_([status_literal(s) for s in sorted(UNFINISHED)]),
        )
        .limit(sa.bindparam("bound", type_=sa.Integer))
        .subquery()
    )
    return sa.select(sa.func.count()).select_from(unfinished)


@cache
def intake_status() -> Any:
    """One job's state, its label (the document's label written by this job, else its latest
    accepted classification) and its open review's reason."""
    answer = (
        sa.select(classifications.c.label, classifications.c.confidence)
        .where(classifications.c.job_id == jobs.c.id, classifications.c.outcome == "accepted")
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("answer")
    )
    review = (
        sa.select(manual_review.c.reason)
        .where(manual_review.c.job_id == jobs.c.id, manual_review.c.resolved_at.is_(None))
        .limit(1)
        .lateral("review")
    )
    stored = document_labels.alias("stored")
    return (
        sa.select(
            jobs.c.id,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.correlation_id,
            jobs.c.status,
            jobs.c.step,
            jobs.c.attempt,
            sa.func.coalesce(stored.c.label, answer.c.label).label("label"),
            sa.func.coalesce(stored.c.confidence, answer.c.confidence).label("confidence"),
            review.c.reason,
            jobs.c.last_error_class,
            jobs.c.created_at,
            jobs.c.updated_at,
        )
        .select_from(
            jobs.outerjoin(stored, stored.c.job_id == jobs.c.id)
            .outerjoin(answer, sa.true())
            .outerjoin(review, sa.true())
        )
        .where(jobs.c.id == sa.bindparam("job_id", type_=UUID))
    )
