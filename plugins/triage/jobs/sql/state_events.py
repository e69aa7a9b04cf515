"""The outbox events a move emits because of the state it enters, as pieces of its statement.

A job that enters ``manual_review`` gets a ``job.needs_review`` event and one that enters
``terminal_failed`` a ``job.failed`` event, whoever moved it (a step, recovery, reconciliation,
a reviewer), in the statement of the move: the same transaction, through the outbox, like
``job.completed``. Payloads carry codes and labels, never document text or an error's text
(which may echo input): :mod:`triage.contracts.events` names each type's keys.

Nothing here executes anything: the statements of :mod:`.moves.worker`, :mod:`.moves.recovery`,
:mod:`.moves.repairs` and :mod:`.moves.review` include these.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.sql.expressions import outbox_insert, review_rows, status_literal
from triage.jobs.vocabulary.states import EventType
from triage.jobs.vocabulary.states import JobStatus as S


def entered_review(moved: Any, reason: ColumnElement[Any] | None = None, context: Any = None) -> tuple[Any, Any]:
    """What follows a move that may end in ``manual_review`` (``moved`` returns
    :data:`~triage.jobs.sql.expressions.MOVED`): the open review row
    (:func:`~triage.jobs.sql.expressions.review_rows`, with ``reason``, by default the job's
    ``status_reason``, and ``context``) and the ``job.needs_review`` event of each job now in
    review. Add both to the move's statement: ``.add_cte(*entered_review(…))``."""
    reason = moved.c.status_reason if reason is None else reason
    return review_rows(moved, reason, context).cte("reviews"), needs_review(moved, reason)


def needs_review(moved: Any, reason: ColumnElement[Any] | None = None) -> Any:
    """The ``job.needs_review`` events (a CTE) of the rows of ``moved`` now in ``manual_review``:
    ``reason`` (by default the ``status_reason``) and the error class."""
    reason = moved.c.status_reason if reason is None else reason
    in_review = moved.c.status == status_literal(S.MANUAL_REVIEW)
    payload = problem_payload(reason, moved.c.last_error_class)
    return outbox_insert(moved, EventType.NEEDS_REVIEW, payload, where=in_review).cte("review_events")


def failed(move: Any) -> Any:
    """The ``job.failed`` events of a move into ``terminal_failed`` (an UPDATE returning
    :data:`~triage.jobs.sql.expressions.MOVED`): an INSERT over it, the move as its CTE."""
    moved = move.cte("moved")
    return outbox_insert(moved, EventType.FAILED, problem_payload(moved.c.status_reason, moved.c.last_error_class))


def problem_payload(reason: ColumnElement[Any], error_class: ColumnElement[Any]) -> ColumnElement[Any]:
    """The payload of ``job.needs_review`` and ``job.failed``: the reason (a code, e.g.
    ``retries_exhausted``) and the error class when there is one."""
    return sa.func.jsonb_strip_nulls(
        sa.func.jsonb_build_object("reason", sa.cast(reason, sa.Text), "error_class", sa.cast(error_class, sa.Text))
    )


def label_payload(rows: Any) -> ColumnElement[Any]:
    """The payload of ``job.completed``: the label written with it (``label``, ``confidence``,
    ``classifier_version`` of ``rows``); ``{}`` for a completion without one."""
    return sa.case(
        (rows.c.label.is_(None), sa.cast(sa.literal("{}"), pg.JSONB)),
        else_=sa.func.jsonb_build_object(
            "label", rows.c.label, "confidence", rows.c.confidence, "classifier_version", rows.c.classifier_version
        ),
    )
