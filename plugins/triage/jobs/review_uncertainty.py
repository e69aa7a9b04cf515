"""The review queue in the order of what the model is least sure of (issue #27, item 6).

    page = uncertain_page(conn, QueueFilter(reason="inconclusive"), limit=50)
    more = uncertain_page(conn, QueueFilter(reason="inconclusive"), limit=50, after=page.next_after)

Each open review's *uncertainty* is read from the model's latest answer for its job: the margin
between its first two candidate labels (``classifications.candidates``, best first) where it
named two, else its confidence, else :data:`NO_ANSWER` (no answer at all: a malformed input,
retries that ran out), so reviews the model could not answer come last. Smallest first, then
oldest, then by review id: ``(uncertainty, created_at, id)`` is the page's key and the cursor,
so a page starts exactly after the last row shown, whatever was decided meanwhile.

The key lives in two tables (the review row and its job's latest classification), so no index
can hold it: a page sorts the open reviews that pass the filter (a top-N sort, memory bounded by
the page) after one probe per review of ``classifications (job_id, attempt)``. Measured at
100,000 open reviews in docs/review.md. Rows as :func:`triage.jobs.review_queue.queue_page`'s,
plus ``uncertainty`` and the model's ``candidates``. Nothing here writes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.expressions import NOW, status_literal
from triage.jobs.expressions import seconds_param as seconds
from triage.jobs.review_queue import MAX_PAGE, QueueFilter
from triage.jobs.schema import classifications, jobs, manual_review
from triage.jobs.states import JobStatus as S

__all__ = ["AUDIT_SAMPLE", "NO_ANSWER", "UncertainCursor", "UncertainPage", "uncertain_page", "uncertainty_statement"]

NO_ANSWER = 2.0
"""The uncertainty of a review whose job has no answer of the model: above every margin and
confidence (both within [0, 1]), so such reviews come after the ones a reviewer can teach from."""

AUDIT_SAMPLE = "audit_sample"
"""The reason of an audit: an auto-accepted job sent to a reviewer without holding back its label,
so its job may have moved on (``completed``) while its review is open. Every other open review
is of a job in ``manual_review``, as in the default order."""

UncertainCursor = tuple[float, datetime, int]
"""Where a page in uncertainty order ends: the ``(uncertainty, created_at, id)`` of its last row."""


@dataclass(frozen=True, slots=True)
class UncertainPage:
    rows: list[dict[str, Any]]
    next_after: UncertainCursor | None  # None: this was the last page


def _score(candidates: Any, index: int) -> Any:
    return candidates[index]["score"]


def uncertainty(candidates: Any, confidence: Any) -> Any:
    """The SQL of a review's uncertainty from its job's latest answer (see the module's docstring).
    A candidate whose score is not a JSON number counts as no candidate (never a failed cast)."""
    both = sa.and_(
        sa.func.jsonb_typeof(_score(candidates, 0)) == "number",
        sa.func.jsonb_typeof(_score(candidates, 1)) == "number",
    )
    margin = sa.cast(_score(candidates, 0).astext, sa.Float) - sa.cast(_score(candidates, 1).astext, sa.Float)
    return sa.case((both, margin), else_=sa.func.coalesce(confidence, sa.literal(NO_ANSWER, sa.Float)))


@cache
def uncertainty_statement(given: frozenset[str], after: bool) -> sa.Select[Any]:
    """Open reviews, least sure first, with the ``given`` filters (``:reason``, ``:source``,
    ``:batch``, ``:older_than_seconds``, as the default order's), after ``(:after_uncertainty,
    :after_at, :after_id)`` when ``after``, at most ``:limit`` rows."""
    model = (
        sa.select(
            classifications.c.label,
            classifications.c.confidence,
            classifications.c.outcome,
            classifications.c.candidates,
        )
        .where(classifications.c.job_id == manual_review.c.job_id)
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("model")
    )
    query = (
        sa.select(
            manual_review.c.id.label("review_id"),
            manual_review.c.job_id,
            manual_review.c.reason,
            manual_review.c.error_class,
            manual_review.c.created_at.label("opened_at"),
            sa.func.extract("epoch", NOW - manual_review.c.created_at).label("age_seconds"),
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.batch_key,
            jobs.c.step,
            jobs.c.attempt,
            jobs.c.max_attempts,
            jobs.c.attempt_base,
            model.c.label.label("model_label"),
            model.c.confidence.label("model_confidence"),
            model.c.outcome.label("model_outcome"),
            model.c.candidates,
            uncertainty(model.c.candidates, model.c.confidence).label("uncertainty"),
        )
        .select_from(manual_review)
        .join(jobs, jobs.c.id == manual_review.c.job_id)
        .outerjoin(model, sa.true())
        .where(
            manual_review.c.resolved_at.is_(None),
            sa.or_(jobs.c.status == status_literal(S.MANUAL_REVIEW), manual_review.c.reason == AUDIT_SAMPLE),
        )
    )
    if "reason" in given:
        query = query.where(manual_review.c.reason == sa.bindparam("reason", type_=sa.Text))
    if "source" in given:
        query = query.where(jobs.c.source == sa.bindparam("source", type_=sa.Text))
    if "batch" in given:
        query = query.where(jobs.c.batch_key == sa.bindparam("batch", type_=sa.Text))
    if "older_than_seconds" in given:
        query = query.where(manual_review.c.created_at <= NOW - seconds("older_than_seconds"))
    ranked = query.subquery("ranked")
    page = sa.select(ranked)
    if after:
        page = page.where(
            sa.tuple_(ranked.c.uncertainty, ranked.c.opened_at, ranked.c.review_id)
            > sa.tuple_(
                sa.bindparam("after_uncertainty", type_=sa.Float),
                sa.bindparam("after_at", type_=sa.DateTime(timezone=True)),
                sa.bindparam("after_id", type_=sa.BigInteger),
            )
        )
    return page.order_by(ranked.c.uncertainty, ranked.c.opened_at, ranked.c.review_id).limit(
        sa.bindparam("limit", type_=sa.Integer)
    )


def uncertain_page(
    conn: sa.Connection, where: QueueFilter, *, limit: int, after: UncertainCursor | None = None
) -> UncertainPage:
    """One page of the queue least sure first (``limit`` rows, at most :data:`MAX_PAGE`), and
    where the next begins."""
    if not 1 <= limit <= MAX_PAGE:
        raise ValueError(f"limit must be between 1 and {MAX_PAGE}")
    params: dict[str, Any] = {k: getattr(where, k) for k in where.given()}
    params["limit"] = limit + 1  # one more tells whether a next page exists
    if after is not None:
        params["after_uncertainty"], params["after_at"], params["after_id"] = after
    rows = [r._asdict() for r in conn.execute(uncertainty_statement(where.given(), after is not None), params)]
    more = len(rows) > limit
    rows = rows[:limit]
    last = rows[-1] if rows else None
    cursor = (float(last["uncertainty"]), last["opened_at"], last["review_id"]) if more and last else None
    return UncertainPage(rows, cursor)
