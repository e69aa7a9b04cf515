"""A reviewer's decisions, as named SQLAlchemy Core statements.

Each decision is one fenced UPDATE of a job in ``manual_review`` (zero rows: not in review, or
a concurrent decision won), chained with the resolution of its open review row and its outbox
event. The reviewer is the transaction's actor, so ``job_events`` names them. Nothing here
executes anything: :mod:`triage.jobs.store.review` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import jobs, manual_review, outbox
from triage.jobs.sql.expressions import (
    EVENT_COLUMNS,
    NOW,
    UUID,
    outbox_insert,
    status_literal,
)
from triage.jobs.sql.moves.replays import requeued
from triage.jobs.vocabulary.states import EventType
from triage.jobs.vocabulary.states import JobStatus as S


@cache
def requeue_from_review() -> Any:
    """Review decision "requeue": ``manual_review -> queued`` as a fresh job (a new attempt
    budget, no lease rescues, no last error: the review row and the log keep those), a replay
    counted (bounded by ``:max_replays``), the review row resolved and a ``job.requeued`` event:
    the replay of one job (:func:`triage.jobs.sql.moves.replays.requeued`)."""
    one = [jobs.c.id == sa.bindparam("p_job_id", type_=UUID), jobs.c.status == status_literal(S.MANUAL_REVIEW)]
    return requeued(one, sa.literal("requeued"))


def _text(name: str) -> ColumnElement[Any]:
    """A text parameter typed in the SQL (``jsonb_build_object`` takes ``"any"``)."""
    return sa.cast(sa.bindparam(name, type_=sa.Text), sa.Text)


def _decided(to: S, reason: str) -> Any:
    """``manual_review -> to`` for the job ``:p_job_id``, fenced on its state."""
    return (
        sa.update(jobs)
        .where(jobs.c.id == sa.bindparam("p_job_id", type_=UUID), jobs.c.status == status_literal(S.MANUAL_REVIEW))
        .values(status=status_literal(to), status_reason=reason, updated_at=NOW)
        .returning(*EVENT_COLUMNS)
        .cte("moved")
    )


def _resolve_review(moved: Any, resolution: str, context: ColumnElement[Any] | None = None) -> Any:
    """Resolve the open review row of the moved job, naming the reviewer and their note."""
    values: dict[str, Any] = {
        "resolved_at": NOW,
        "resolution": resolution,
        "resolved_by": _text("p_actor"),
        "note": sa.bindparam("p_note", type_=sa.Text),
    }
    if context is not None:
        values["context"] = manual_review.c.context.op("||")(context)
    return (
        sa.update(manual_review)
        .where(manual_review.c.job_id == sa.select(moved.c.id).scalar_subquery(), manual_review.c.resolved_at.is_(None))
        .values(**values)
        .cte("resolved")
    )


def _review_event(moved: Any, event_type: EventType, payload: ColumnElement[Any]) -> Any:
    """The decision's outbox event; its payload says what was decided and by whom (never a document)."""
    return outbox_insert(moved, event_type, payload)


@cache
def label_from_review() -> Any:
    """Review decision "label": ``manual_review -> completed``, the review row resolved
    ``labelled`` (the label kept in its context as ``resolved_label``) and a ``job.completed``
    event. The business output is written by :func:`triage.jobs.sql.writes.outputs.upsert_labels` in the same transaction, so a
    newer job's label is never overwritten by a reviewer either."""
    moved = _decided(S.COMPLETED, "labelled")
    resolved = _resolve_review(moved, "labelled", sa.func.jsonb_build_object("resolved_label", _text("p_label")))
    # The shape of a classifier's completion (label, confidence, classifier_version: as
    # document_labels gets it, ``human:<reviewer>`` and no confidence) and the decision.
    payload = sa.func.jsonb_build_object(
        "resolution",
        "labelled",
        "label",
        _text("p_label"),
        "confidence",
        sa.null(),
        "classifier_version",
        sa.func.concat("human:", _text("p_actor")),
        "resolved_by",
        _text("p_actor"),
    )
    return _review_event(moved, EventType.COMPLETED, payload).returning(outbox.c.job_id).add_cte(resolved)


@cache
def reject_from_review() -> Any:
    """Review decision "reject": ``manual_review -> terminal_failed``, the review row resolved
    ``rejected``, a ``job.reviewed`` event (the decision) and a ``job.failed`` event (the state
    it entered, as every move into ``terminal_failed`` has)."""
    moved = _decided(S.TERMINAL_FAILED, "rejected")
    resolved = _resolve_review(moved, "rejected")
    payload = sa.func.jsonb_build_object("resolution", "rejected", "resolved_by", _text("p_actor"))
    failed = _review_event(
        moved, EventType.FAILED, sa.func.jsonb_build_object("reason", "rejected", "resolved_by", _text("p_actor"))
    ).cte("failed")
    return _review_event(moved, EventType.REVIEWED, payload).returning(outbox.c.job_id).add_cte(resolved, failed)
