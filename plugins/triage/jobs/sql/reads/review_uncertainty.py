"""The review queue in the order of what the model is least sure of (issue #27, item 6).

    page = uncertain_page(conn, QueueFilter(reason="inconclusive"), limit=50)
    more = uncertain_page(conn, QueueFilter(reason="inconclusive"), limit=50, after=page.next_after)

An open review's *uncertainty* comes from the model's answer that sent it there: the margin
between its first two candidate labels (``classifications.candidates``, best first) where it
named two, else its confidence (:func:`answer_uncertainty`). It is written into the review row's
``context`` (``uncertainty``) when the row is opened with an answer
(:mod:`triage.jobs.store.recording`; migration 0028 filled the rows open then), so the order is a key
of the review row alone (:data:`triage.jobs.schema.REVIEW_UNCERTAINTY`): a row without one (no
answer: a malformed input, retries that ran out, an answer rejected as malformed) counts as :data:`NO_ANSWER` and comes last.
Smallest first, then oldest, then by review id: ``(uncertainty, created_at, id)`` is the page's
key and its cursor, so a page starts exactly after the last row shown, whatever was decided
meanwhile.

A page is one statement read along ``manual_review_open_uncertainty_idx`` (or
``manual_review_open_reason_uncertainty_idx`` for a reason), each row joined to its job by
primary key and, for the page's rows only, to the model's latest answer (label, confidence,
outcome, candidates) by ``(job_id, attempt)``. Measured at 100,000 open reviews in
docs/review.md. Rows as :func:`triage.jobs.sql.reads.review_queue.queue_page`'s, plus ``uncertainty`` and
``candidates``. Nothing here writes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import REVIEW_UNCERTAINTY, classifications, jobs, manual_review
from triage.jobs.sql.reads.review_queue import MAX_PAGE, QueueFilter, filtered, open_reviews, with_model_answer

__all__ = [
    "NO_ANSWER",
    "UncertainCursor",
    "UncertainPage",
    "answer_uncertainty",
    "uncertain_page",
    "uncertainty_statement",
]

NO_ANSWER = 2.0
"""The uncertainty of a review opened without an answer of the model: above every margin and
confidence (both within [0, 1]), so such reviews come after the ones a reviewer can teach from
(the ``ELSE`` of :data:`triage.jobs.schema.REVIEW_UNCERTAINTY`)."""

UncertainCursor = tuple[float, datetime, int]
"""Where a page in uncertainty order ends: the ``(uncertainty, created_at, id)`` of its last row."""


@dataclass(frozen=True, slots=True)
class UncertainPage:
    rows: list[dict[str, Any]]
    next_after: UncertainCursor | None  # None: this was the last page


def answer_uncertainty(candidates: Sequence[tuple[str, float]] | None, confidence: float | None) -> float | None:
    """How unsure an answer is: the margin between its first two candidates' scores, else its
    confidence; None: no answer to be unsure of (or a number JSON cannot hold)."""
    if candidates is not None and len(candidates) >= 2:
        value: float | None = candidates[0][1] - candidates[1][1]
    else:
        value = confidence
    return value if value is not None and math.isfinite(value) else None


@cache
def uncertainty_statement(given: frozenset[str], after: bool) -> sa.Select[Any]:
    """Open reviews, least sure first, with the ``given`` filters (``:reason``, ``:source``,
    ``:batch``, ``:older_than_seconds``, as the default order's), after ``(:after_uncertainty,
    :after_at, :after_id)`` when ``after``, at most ``:limit`` rows."""
    # The index's own expression, as SQL text: the planner matches it to the index only when it is
    # the same expression with the same constants (a bound parameter would not match).
    key = sa.literal_column(REVIEW_UNCERTAINTY, sa.Float)
    query = filtered(open_reviews(key.label("uncertainty")), given)
    if "batch" in given:
        query = query.where(jobs.c.batch_key == sa.bindparam("batch", type_=sa.Text))
    if after:
        query = query.where(
            sa.tuple_(key, manual_review.c.created_at, manual_review.c.id)
            > sa.tuple_(
                sa.bindparam("after_uncertainty", type_=sa.Float),
                sa.bindparam("after_at", type_=sa.DateTime(timezone=True)),
                sa.bindparam("after_id", type_=sa.BigInteger),
            )
        )
    page = (
        query.order_by(key, manual_review.c.created_at, manual_review.c.id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .subquery("page")
    )
    return with_model_answer(page, classifications.c.candidates).order_by(
        page.c.uncertainty, page.c.opened_at, page.c.review_id
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
