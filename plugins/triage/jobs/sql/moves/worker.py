"""Every way a worker's job moves, as named SQLAlchemy Core statements: the claim and its lease,
and the outcome of an attempt (registration is :mod:`.registration`).

Each statement is one fenced, set-based write: ``UPDATE … WHERE <expected state and lease> …
RETURNING``, a batch read from one JSON document (:func:`triage.jobs.sql.expressions.rowset`). The
trigger on ``triage.jobs`` checks each move against ``triage.job_transitions`` and logs it in
``triage.job_events``; these statements set ``status_reason``, which the trigger copies into
the log. The other moves are :mod:`.recovery` (leases that ran out, a failed task's batch)
and :mod:`.review` (a reviewer's decisions).

Nothing here executes anything: :mod:`triage.jobs.store` runs these inside its transactions.
Each builder is cached: a statement is built once per process and reused (rebuilding the
constructs cost more than a round trip per call, measured).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import jobs, outbox
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import (
    EVENT_COLUMNS,
    MOVED,
    NO_LEASE,
    NOW,
    UUID,
    fresh_budget,
    outbox_insert,
    recordset,
    seconds_param,
    status_literal,
)
from triage.jobs.sql.moves.outages import outage_due
from triage.jobs.vocabulary.states import OUTAGE_PREFIX, EventType
from triage.jobs.vocabulary.states import JobStatus as S


@cache
def claim_batch(versioned: bool = False) -> Any:
    """Claim up to ``:limit`` claimable jobs of a batch and step under a fresh lease.

    ``FOR UPDATE SKIP LOCKED`` lets many workers claim from one batch without waiting on or
    double-taking each other; the attempt is counted here, at claim time, so a worker that dies
    mid-attempt still used one. Served by ``jobs_claimable_idx``; suspects of poison isolation
    (see :func:`triage.jobs.sql.moves.recovery.release_expired_leases`) by ``jobs_suspects_idx``.

    ``versioned``: only jobs registered for the classifier version ``:p_classifier_version``
    (the classify step: a job is labelled only by the classifier its idempotency key names).
    The others stay as they are for a run of their own version. A filter on the rows the index
    yields: the jobs of one batch and step are nearly always of one version.
    """
    version = [jobs.c.classifier_version == sa.bindparam("p_classifier_version", type_=sa.Text)] if versioned else []
    claimable = [
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
        sa.or_(
            jobs.c.status == status_literal(S.QUEUED),
            sa.and_(jobs.c.status == status_literal(S.RETRYABLE_FAILED), jobs.c.next_attempt_at <= NOW),
        ),
        jobs.c.attempt < jobs.c.max_attempts,
        *version,
    ]
    # Poison isolation: suspects (jobs whose claim died under them) are claimed only with
    # suspects of the same cap, at most that many, smallest cap first (the group nearest the
    # poison). One probe of jobs_suspects_idx, empty on the common path; clean jobs are claimed
    # only when no suspect is claimable, so a claim never mixes them.
    cap = (
        sa.select(jobs.c.suspect_cap)
        .where(*claimable, jobs.c.suspect_cap.is_not(None))
        .order_by(jobs.c.suspect_cap)
        .limit(1)
        .cte("cap")
    )
    cap_value = sa.select(cap.c.suspect_cap).scalar_subquery()
    suspects = (
        sa.select(jobs.c.id)
        .where(*claimable, jobs.c.suspect_cap == cap_value)
        .order_by(jobs.c.next_attempt_at)
        .limit(sa.func.least(sa.bindparam("limit", type_=sa.Integer), cap_value))
        .with_for_update(skip_locked=True)
        .cte("suspects")
    )
    clean = (
        sa.select(jobs.c.id)
        .where(*claimable, jobs.c.suspect_cap.is_(None), ~sa.exists(sa.select(cap.c.suspect_cap)))
        .order_by(jobs.c.next_attempt_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("picked")
    )
    picked = sa.union_all(sa.select(suspects.c.id), sa.select(clean.c.id)).subquery()
    return (
        sa.update(jobs)
        # = ANY(ARRAY(…)) rather than a join: the planner cannot know the LIMIT's size and
        # hashed the whole table to join it (20 ms per claim at 50,000 jobs, measured); an
        # array of ids always goes through the primary key.
        .where(jobs.c.id == sa.any_(sa.func.array(sa.select(picked.c.id).scalar_subquery())))
        .values(
            status=status_literal(S.RUNNING),
            status_reason="claimed",
            attempt=jobs.c.attempt + 1,
            lease_owner=sa.bindparam("owner", type_=sa.Text),
            lease_token=sa.bindparam("token", type_=UUID),
            lease_expires_at=NOW + seconds_param("lease_seconds"),
            next_attempt_at=None,
            updated_at=NOW,
        )
        .returning(
            jobs.c.id,
            jobs.c.idempotency_key,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.content_sha256,
            jobs.c.payload_ref,
            jobs.c.classifier_version,
            jobs.c.correlation_id,
            jobs.c.step,
            jobs.c.attempt,
            jobs.c.max_attempts,
            jobs.c.created_at,
            jobs.c.attempt_base,
            jobs.c.lease_expires_at,
        )
    )


def _held(rows: Any) -> list[ColumnElement[bool]]:
    """The fence of every write by a lease holder: this job, this attempt, still ours, in time."""
    return [
        jobs.c.id == rows.c.id,
        jobs.c.attempt == rows.c.attempt,
        jobs.c.status == status_literal(S.RUNNING),
        jobs.c.lease_token == sa.bindparam("token", type_=UUID),
        jobs.c.lease_expires_at > NOW,
    ]


@cache
def extend_leases() -> Any:
    """Heartbeat: push the lease of held jobs forward; an expired or lost lease is not revived."""
    return (
        sa.update(jobs)
        .where(
            jobs.c.id == sa.any_(sa.bindparam("ids", type_=pg.ARRAY(UUID))),
            jobs.c.status == status_literal(S.RUNNING),
            jobs.c.lease_token == sa.bindparam("token", type_=UUID),
            jobs.c.lease_expires_at > NOW,
        )
        .values(lease_expires_at=NOW + seconds_param("lease_seconds"), updated_at=NOW)
        .returning(jobs.c.id, jobs.c.lease_expires_at)
    )


HELD = dict(id=UUID, attempt=sa.Integer)


@cache
def complete() -> Any:
    """``running -> completed`` with the ``job.completed`` event (its id from the batch, its payload the label)."""
    held = recordset("held", **HELD, event_id=UUID, label=sa.Text, confidence=sa.Float, classifier_version=sa.Text)
    done = (
        sa.update(jobs)
        .where(*_held(held))
        .values(status=status_literal(S.COMPLETED), status_reason="completed", updated_at=NOW, **NO_LEASE)
        .returning(*EVENT_COLUMNS, held.c.event_id, held.c.label, held.c.confidence, held.c.classifier_version)
        .cte("done")
    )
    return outbox_insert(done, EventType.COMPLETED, E.label_payload(done)).returning(outbox.c.job_id)


@cache
def advance() -> Any:
    """``running -> queued`` at the next step, with a fresh attempt budget; a suspect of poison
    isolation is clean again (it survived the step whose claims died)."""
    held = recordset("held", **HELD, next_step=sa.Text)
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=status_literal(S.QUEUED),
            status_reason="advanced",
            step=held.c.next_step,
            updated_at=NOW,
            suspect_cap=None,
            **fresh_budget(),
            **NO_LEASE,
        )
        .returning(jobs.c.id)
    )


@cache
def retry_later() -> Any:
    """A transient failure: ``retryable_failed`` until ``now + delay``, or, when the attempts
    are spent, ``manual_review`` with reason ``retries_exhausted`` and its review row."""
    held = recordset("held", **HELD, error_class=sa.Text, error=sa.Text, delay_seconds=sa.Float)
    spent = jobs.c.attempt >= jobs.c.max_attempts
    moved = (
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=sa.case((spent, status_literal(S.MANUAL_REVIEW)), else_=status_literal(S.RETRYABLE_FAILED)),
            status_reason=sa.case((spent, "retries_exhausted"), else_=held.c.error_class),
            next_attempt_at=sa.case(
                (spent, None), else_=NOW + sa.func.make_interval(0, 0, 0, 0, 0, 0, held.c.delay_seconds)
            ),
            last_error_class=held.c.error_class,
            last_error=held.c.error,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
        .cte("moved")
    )
    context = sa.func.jsonb_build_object("retryable", True)
    return sa.select(moved.c.id, moved.c.status).add_cte(*E.entered_review(moved, context=context))


def review_rows() -> Any:
    """The rows of a move to review: a job and its attempt, with the reason, error and context."""
    return recordset("held", **HELD, reason=sa.Text, error_class=sa.Text, error=sa.Text, context=sa.Text)


def to_review(held: Any, fence: list[ColumnElement[bool]], **values: Any) -> Any:
    """``-> manual_review`` of the jobs of ``held`` (:func:`review_rows`) that ``fence`` lets
    through, with ``values`` besides the reason and error, and their review rows."""
    moved = (
        sa.update(jobs)
        .where(*fence)
        .values(
            status=status_literal(S.MANUAL_REVIEW),
            status_reason=held.c.reason,
            last_error_class=held.c.error_class,
            last_error=held.c.error,
            updated_at=NOW,
            **values,
        )
        .returning(*MOVED, sa.cast(held.c.context, pg.JSONB).label("context"))
        .cte("moved")
    )
    # The context comes back through RETURNING: a subquery per moved row would re-read the batch.
    return sa.select(moved.c.id, moved.c.status).add_cte(*E.entered_review(moved, context=moved.c.context))


@cache
def send_to_review() -> Any:
    """``running -> manual_review`` with a reason and context, and its review row."""
    held = review_rows()
    return to_review(held, _held(held), **NO_LEASE)


@cache
def fail() -> Any:
    """``running -> terminal_failed``: permanent, and no human needs to look; a ``job.failed`` event."""
    held = recordset("held", **HELD, reason=sa.Text, error_class=sa.Text, error=sa.Text)
    return E.failed(
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=status_literal(S.TERMINAL_FAILED),
            status_reason=held.c.reason,
            last_error_class=held.c.error_class,
            last_error=held.c.error,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
    ).returning(outbox.c.job_id)


@cache
def release() -> Any:
    """``running -> queued`` for claimed work that never started: the attempt is given back."""
    held = recordset("held", **HELD)
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=status_literal(S.QUEUED),
            status_reason="released",
            attempt=jobs.c.attempt - 1,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(jobs.c.id)
    )


@cache
def park() -> Any:
    """``running -> waiting`` on an outage (reason ``outage:<dependency>``) until ``now + delay``
    (grown with ``backoff``: :func:`~triage.jobs.sql.moves.outages.outage_due`): the attempt is given
    back, as for a release, since the dependency failed, not the job."""
    held = recordset(
        "held",
        **HELD,
        dependency=sa.Text,
        delay_seconds=sa.Float,
        backoff=sa.Boolean,
        error_class=sa.Text,
        error=sa.Text,
    )
    return (
        sa.update(jobs)
        .where(*_held(held))
        .values(
            status=status_literal(S.WAITING),
            status_reason=sa.func.concat(OUTAGE_PREFIX, held.c.dependency),
            attempt=jobs.c.attempt - 1,
            next_attempt_at=outage_due(held.c.delay_seconds, held.c.backoff),
            last_error_class=held.c.error_class,
            last_error=held.c.error,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(jobs.c.id)
    )
