"""The review pages' reads of the ledger: the open-review queue a page at a time, and everything
about one job. Nothing here writes (the decisions are the store's part ``JobStore.review``).

    page = queue_page(conn, QueueFilter(reason="inconclusive"), limit=50)
    more = queue_page(conn, QueueFilter(reason="inconclusive"), limit=50, after=page.next_after)

A page is one statement, whatever the size of the queue: open reviews oldest first after the
last ``(created_at, id)`` shown (keyset pagination, never an OFFSET), read along
``manual_review_open_queue_idx`` (or ``manual_review_open_reason_idx`` for a reason), each row
joined to its job by primary key and to the model's latest answer by ``(job_id, attempt)``.
The statement holds only the filters given, so the planner sees no ``:x IS NULL OR …`` arms.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import classifications, job_events, jobs, manual_review
from triage.jobs.sql.audit_samples import AUDIT_REASON, awaits_decision
from triage.jobs.sql.expressions import NOW, UUID, status_literal
from triage.jobs.sql.expressions import seconds_param as seconds
from triage.jobs.vocabulary.states import JobStatus as S

MAX_PAGE = 500
"""The most rows one page may ask for (the pages and the API refuse more)."""

Cursor = tuple[datetime, int]
"""Where a page ends: the ``(created_at, id)`` of its last review row."""


@dataclass(frozen=True, slots=True)
class QueueFilter:
    """Which open reviews to list; None is "any". ``older_than_seconds``: in review at least that long."""

    reason: str | None = None
    source: str | None = None
    batch: str | None = None
    older_than_seconds: float | None = None

    def given(self) -> frozenset[str]:
        return frozenset(k for k in ("reason", "source", "batch", "older_than_seconds") if getattr(self, k) is not None)


@dataclass(frozen=True, slots=True)
class QueuePage:
    rows: list[dict[str, Any]]
    next_after: Cursor | None  # None: this was the last page


def open_reviews(*extra: Any) -> sa.Select[Any]:
    """The open reviews that wait for a reviewer (:func:`awaits_decision`), each joined to its job,
    as a queue row's columns (and ``extra``): what both orders of the queue page through."""
    return (
        sa.select(
            manual_review.c.id.label("review_id"),
            manual_review.c.job_id,
            manual_review.c.reason,
            manual_review.c.error_class,
            manual_review.c.created_at.label("opened_at"),
            sa.func.extract("epoch", NOW - manual_review.c.created_at).label("age_seconds"),
            *extra,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.batch_key,
            jobs.c.step,
            jobs.c.attempt,
            jobs.c.max_attempts,
            jobs.c.attempt_base,
        )
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .where(manual_review.c.resolved_at.is_(None), awaits_decision())
    )


def filtered(query: sa.Select[Any], given: frozenset[str]) -> sa.Select[Any]:
    """``query`` with the ``given`` filters but the batch (``:reason``, ``:source``,
    ``:older_than_seconds``); each order reads a batch its own way."""
    if "reason" in given:
        query = query.where(manual_review.c.reason == sa.bindparam("reason", type_=sa.Text))
    if "source" in given:
        query = query.where(jobs.c.source == sa.bindparam("source", type_=sa.Text))
    if "older_than_seconds" in given:
        query = query.where(manual_review.c.created_at <= NOW - seconds("older_than_seconds"))
    return query


@cache
def queue_statement(given: frozenset[str], after: bool) -> sa.Select[Any]:
    """Open reviews oldest first with the ``given`` filters (``:reason``, ``:source``,
    ``:batch``, ``:older_than_seconds``), after ``(:after_at, :after_id)`` when ``after``, at most
    ``:limit`` rows."""
    query = filtered(open_reviews(), given)
    if "batch" in given:
        # A batch's reviews sit together in the queue (one run sends them at once), so walking the
        # queue's index until 50 of them turn up reads every older review first. Start from the
        # batch's jobs in review (jobs_batch_key_status_idx) instead: a run's worth, sorted. Its
        # audit samples (completed jobs) come from the open audit rows (the open reason index).
        batch = sa.bindparam("batch", type_=sa.Text)
        audited = (
            sa.select(manual_review.c.job_id)
            .join(jobs, jobs.c.id == manual_review.c.job_id)
            .where(
                manual_review.c.resolved_at.is_(None),
                manual_review.c.reason == AUDIT_REASON,
                jobs.c.batch_key == batch,
            )
        )
        in_batch = (
            sa.select(jobs.c.id)
            .where(jobs.c.batch_key == batch, jobs.c.status == status_literal(S.MANUAL_REVIEW))
            .union_all(audited)
            .cte("in_batch")
            .prefix_with("MATERIALIZED")
        )
        query = query.where(manual_review.c.job_id.in_(sa.select(in_batch.c.id)))
    if after:
        query = query.where(
            sa.tuple_(manual_review.c.created_at, manual_review.c.id)
            > sa.tuple_(
                sa.bindparam("after_at", type_=sa.DateTime(timezone=True)),
                sa.bindparam("after_id", type_=sa.BigInteger),
            )
        )
    page = (
        query.order_by(manual_review.c.created_at, manual_review.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .subquery("page")
    )
    return with_model_answer(page).order_by(page.c.opened_at, page.c.review_id)


def with_model_answer(page: Any, *extra: Any) -> sa.Select[Any]:
    """The rows of ``page`` (a subquery of open reviews with their ``job_id``) with the model's
    latest answer: ``model_label``, ``model_confidence``, ``model_outcome`` and the ``extra``
    columns of ``classifications`` (the uncertainty order adds its ``candidates``).

    The answer is looked up for the page's rows only. Joined before the LIMIT, it was looked up
    for every open review whenever the planner sorted the queue instead of walking its index
    (it does once jobs_open_idx offers every job in review: 2,000 pages read for a page of 51
    rows of a queue of 600, 800 now; bench/growth.py)."""
    model = (
        sa.select(classifications.c.label, classifications.c.confidence, classifications.c.outcome, *extra)
        .where(classifications.c.job_id == page.c.job_id)
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("model")
    )
    return (
        sa.select(
            page,
            model.c.label.label("model_label"),
            model.c.confidence.label("model_confidence"),
            model.c.outcome.label("model_outcome"),
            *(model.c[column.name] for column in extra),
        )
        .select_from(page)
        .outerjoin(model, sa.true())
    )


def queue_page(conn: sa.Connection, where: QueueFilter, *, limit: int, after: Cursor | None = None) -> QueuePage:
    """One page of the queue (``limit`` rows, at most :data:`MAX_PAGE`), and where the next begins."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    params: dict[str, Any] = {k: getattr(where, k) for k in where.given()}
    params["limit"] = limit + 1  # one more tells whether a next page exists
    if after is not None:
        params["after_at"], params["after_id"] = after
    rows = [r._asdict() for r in conn.execute(queue_statement(where.given(), after is not None), params)]
    more = len(rows) > limit
    rows = rows[:limit]
    return QueuePage(rows, (rows[-1]["opened_at"], rows[-1]["review_id"]) if more else None)


@cache
def job_row() -> sa.Select[Any]:
    return sa.select(jobs).where(jobs.c.id == sa.bindparam("job_id", type_=UUID))


@cache
def job_events_of() -> sa.Select[Any]:
    """A job's transitions in order (bounded: a job has a few dozen at most)."""
    return (
        sa.select(job_events)
        .where(job_events.c.job_id == sa.bindparam("job_id", type_=UUID))
        .order_by(job_events.c.id)
        .limit(1000)
    )


@cache
def reviews_of() -> sa.Select[Any]:
    """Every review row of a job, open or resolved, oldest first."""
    return (
        sa.select(manual_review)
        .where(manual_review.c.job_id == sa.bindparam("job_id", type_=UUID))
        .order_by(manual_review.c.id)
    )


@cache
def classifications_of() -> sa.Select[Any]:
    return (
        sa.select(classifications)
        .where(classifications.c.job_id == sa.bindparam("job_id", type_=UUID))
        .order_by(classifications.c.attempt)
    )


def job_detail(conn: sa.Connection, job_id: uuid.UUID) -> dict[str, Any] | None:
    """The job, its events, its review rows and its classifications; None if there is no such job."""
    params = {"job_id": job_id}
    job = conn.execute(job_row(), params).first()
    if job is None:
        return None
    return {
        "job": job._asdict(),
        "events": [r._asdict() for r in conn.execute(job_events_of(), params)],
        "reviews": [r._asdict() for r in conn.execute(reviews_of(), params)],
        "classifications": [r._asdict() for r in conn.execute(classifications_of(), params)],
    }
