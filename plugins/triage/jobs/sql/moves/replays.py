"""A replay by filter, as named SQLAlchemy Core statements: the selection, its preview, the
bounded batch that moves jobs back to ``queued``, and the request row that makes it idempotent.

The selection is built from a :class:`~triage.contracts.replay.ReplayFilter` (only the fields it
names become conditions, so each can use its index); every value is a bound parameter. A job's
*reason* is its open review's reason when it is in ``manual_review``, else its
``status_reason``; its *error class* likewise; *since/until* bound ``updated_at``, the time it
entered its state (nothing else updates a failed job). Nothing here executes anything:
:mod:`triage.jobs.store.replays` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.contracts.replay import ReplayFilter
from triage.jobs.schema import job_events, jobs, manual_review, outbox, replay_requests
from triage.jobs.sql.expressions import EVENT_COLUMNS, NO_LEASE, NOW, fresh_budget, outbox_insert, status_literal
from triage.jobs.vocabulary.states import EventType
from triage.jobs.vocabulary.states import JobStatus as S

REPLAY_REASON_PREFIX = "replayed:"
"""A replayed job's ``status_reason`` (and so its ``job_events.reason``): ``replayed:<key>``."""

_open_review = manual_review.alias("open_review")
_JOINED = jobs.outerjoin(
    _open_review, sa.and_(_open_review.c.job_id == jobs.c.id, _open_review.c.resolved_at.is_(None))
)
job_reason = sa.func.coalesce(_open_review.c.reason, jobs.c.status_reason)
job_error_class = sa.func.coalesce(_open_review.c.error_class, jobs.c.last_error_class)


def replay_reason(key: str) -> str:
    return f"{REPLAY_REASON_PREFIX}{key}"


def _conditions(selection: ReplayFilter) -> list[ColumnElement[bool]]:
    """What the filter asks for, replays still allowed (``:max_replays``) aside."""
    where: list[ColumnElement[bool]] = [jobs.c.status.in_([status_literal(S(state)) for state in selection.states])]
    if selection.reason is not None:
        where.append(job_reason == sa.bindparam("p_reason", selection.reason, type_=sa.Text))
    if selection.error_class is not None:
        where.append(job_error_class == sa.bindparam("p_error_class", selection.error_class, type_=sa.Text))
    if selection.source is not None:
        where.append(jobs.c.source == sa.bindparam("p_source", selection.source, type_=sa.Text))
    if selection.batch_key is not None:
        where.append(jobs.c.batch_key == sa.bindparam("p_batch_key", selection.batch_key, type_=sa.Text))
    if selection.since is not None:
        where.append(jobs.c.updated_at >= sa.bindparam("p_since", selection.since, type_=sa.DateTime(timezone=True)))
    if selection.until is not None:
        where.append(jobs.c.updated_at < sa.bindparam("p_until", selection.until, type_=sa.DateTime(timezone=True)))
    return where


def _replays_left() -> ColumnElement[bool]:
    return jobs.c.replays < sa.bindparam("max_replays", type_=sa.Integer)


def preview_counts(selection: ReplayFilter) -> Any:
    """``(matching, at_replay_limit)``: the jobs the filter selects that a replay may move, and
    those it selects but that were replayed ``:max_replays`` times already (left alone)."""
    spent = sa.not_(_replays_left())
    return (
        sa.select(sa.func.count().filter(_replays_left()), sa.func.count().filter(spent))
        .select_from(_JOINED)
        .where(*_conditions(selection))
    )


def preview_rows(selection: ReplayFilter) -> Any:
    """The first ``:preview_rows`` jobs a replay would move, in its order (oldest failure first)."""
    return (
        sa.select(
            jobs.c.id,
            jobs.c.status,
            job_reason.label("reason"),
            job_error_class.label("error_class"),
            jobs.c.source,
            jobs.c.batch_key,
            jobs.c.updated_at,
            jobs.c.replays,
        )
        .select_from(_JOINED)
        .where(*_conditions(selection), _replays_left())
        .order_by(jobs.c.updated_at, jobs.c.id)
        .limit(sa.bindparam("preview_rows", type_=sa.Integer))
    )


_REPLAY_REASON = sa.bindparam("p_replay_reason", type_=sa.Text)


def replay_batch(selection: ReplayFilter) -> Any:
    """Up to ``:batch`` selected jobs ``-> queued`` as fresh jobs (the moves ``manual_review ->
    queued`` and ``terminal_failed -> queued``): a new attempt budget, no lease rescues or last
    error, a replay counted (bounded by ``:max_replays``), ``status_reason`` ``:p_replay_reason``;
    each open review row resolved ``requeued`` by ``:p_actor`` with ``:p_note``, and a
    ``job.requeued`` event each. Returns the moved ids.

    Fenced like every move: the UPDATE re-checks the state, so a job a reviewer decided in the
    meantime is not taken. Jobs locked by someone else are skipped (``SKIP LOCKED``), and jobs
    this replay moved before (a resumed replay) never match again.
    """
    conditions = _conditions(selection)
    moved_before = sa.exists().where(
        job_events.c.job_id == jobs.c.id, job_events.c.reason == sa.bindparam("p_replay_reason", type_=sa.Text)
    )
    picked = (
        sa.select(jobs.c.id)
        .select_from(_JOINED)
        .where(*conditions, _replays_left(), sa.not_(moved_before))
        .order_by(jobs.c.updated_at, jobs.c.id)
        .limit(sa.bindparam("batch", type_=sa.Integer))
        .with_for_update(of=jobs, skip_locked=True)
        .cte("picked")
    )
    return requeued([jobs.c.id.in_(sa.select(picked.c.id)), conditions[0]], _REPLAY_REASON, with_reason=True)


def requeued(where: list[ColumnElement[bool]], reason: ColumnElement[Any], *, with_reason: bool = False) -> Any:
    """The jobs ``where`` holds (replays still allowed: ``:max_replays``) ``-> queued`` as fresh
    jobs: a new attempt budget, no lease, lease rescues or last error, a replay counted,
    ``status_reason`` ``reason``; each open review row resolved ``requeued`` by ``:p_actor``
    with ``:p_note``, and a ``job.requeued`` event each (naming the reason ``with_reason``).
    Returns the moved ids. A reviewer's requeue of one job is this move of one
    (:func:`triage.jobs.sql.moves.review.requeue_from_review`), a replay by filter of a batch
    (:func:`replay_batch`)."""
    moved = (
        sa.update(jobs)
        .where(*where, _replays_left())
        .values(
            status=status_literal(S.QUEUED),
            status_reason=reason,
            replays=jobs.c.replays + 1,
            lease_rescues=0,
            last_error_class=None,
            last_error=None,
            next_attempt_at=None,
            updated_at=NOW,
            **NO_LEASE,
            **fresh_budget(),
        )
        .returning(*EVENT_COLUMNS)
        .cte("moved")
    )
    resolved = (
        sa.update(manual_review)
        .where(manual_review.c.job_id.in_(sa.select(moved.c.id)), manual_review.c.resolved_at.is_(None))
        .values(
            resolved_at=NOW,
            resolution="requeued",
            resolved_by=sa.bindparam("p_actor", type_=sa.Text),
            note=sa.bindparam("p_note", type_=sa.Text),
        )
        .cte("resolved")
    )
    named = ("reason", sa.cast(reason, sa.Text)) if with_reason else ()
    payload = sa.func.jsonb_build_object(
        "resolution", "requeued", "resolved_by", sa.cast(sa.bindparam("p_actor", type_=sa.Text), sa.Text), *named
    )
    return outbox_insert(moved, EventType.REQUEUED, payload).returning(outbox.c.job_id).add_cte(resolved)


@cache
def open_request() -> Any:
    """Record the request ``:p_key`` unless it exists (the same submission again)."""
    return (
        pg.insert(replay_requests)
        .values(
            replay_key=sa.bindparam("p_key", type_=sa.Text),
            filter=sa.bindparam("p_filter", type_=pg.JSONB),
            requested_by=sa.bindparam("p_actor", type_=sa.Text),
            note=sa.bindparam("p_note", type_=sa.Text),
        )
        .on_conflict_do_nothing(index_elements=["replay_key"])
    )


@cache
def lock_request() -> Any:
    """The request ``:p_key``, locked: one batch of one request at a time, so its bound holds."""
    return (
        sa.select(replay_requests)
        .where(replay_requests.c.replay_key == sa.bindparam("p_key", type_=sa.Text))
        .with_for_update()
    )


@cache
def read_request() -> Any:
    return sa.select(replay_requests).where(replay_requests.c.replay_key == sa.bindparam("p_key", type_=sa.Text))


@cache
def count_replayed() -> Any:
    """Add ``:moved`` to the request's count; ``:finished`` stamps it applied."""
    finished = sa.bindparam("finished", type_=sa.Boolean)
    return (
        sa.update(replay_requests)
        .where(replay_requests.c.replay_key == sa.bindparam("p_key", type_=sa.Text))
        .values(
            replayed=replay_requests.c.replayed + sa.bindparam("moved", type_=sa.Integer),
            applied_at=sa.case((finished, NOW), else_=replay_requests.c.applied_at),
        )
        .returning(replay_requests)
    )
