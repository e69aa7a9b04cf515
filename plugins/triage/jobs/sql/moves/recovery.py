"""Moves that take work back from whoever held it, as named SQLAlchemy Core statements: leases
that ran out (and earlier tries of a retried task), and the unfinished jobs of a batch whose
task Airflow gave up on. Fenced like every move (:mod:`.worker`); nothing here executes.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import job_events, jobs
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import MOVED, NO_LEASE, NOW, parked, status_literal
from triage.jobs.vocabulary.states import UNLEASED
from triage.jobs.vocabulary.states import JobStatus as S

POISON = "poison"
"""A job that killed its claim even when claimed alone, after its claims had been halved."""


@cache
def release_expired_leases() -> Any:
    """Return jobs whose lease ran out: ``retryable_failed`` (due now), or ``manual_review``
    when their attempts are spent (``retries_exhausted``) or they were rescued too often
    (``lease_expired_repeatedly``).

    With ``:owner_prefix`` set, leases of that prefix other than ``:owner`` count as expired too:
    a retried Airflow task (``dag/run/task/map_index/tryN``) takes back what its own earlier
    tries held without waiting for their leases to run out. Airflow starts a new try once it has
    given the old one up; the old process is normally dead (SIGKILL, OOM), and if it is not (a
    heartbeat timeout while it still runs) its late writes are refused by the lease token, so
    at worst it repeats a model call or an action that carries the same idempotency key.
    ``:p_batch_key`` (optional) limits the release to one batch.

    Fenced twice: ``SKIP LOCKED`` passes over a job a live worker is writing right now, and the
    UPDATE re-checks ``running`` and the expiry under the row lock, so a job that finished in
    the meantime is never touched.

    Poison isolation (``docs/reliability.md``): a claim whose lease is taken back died, and any
    one of its unfinished jobs may have killed it. When it left more than one, each of them
    becomes a suspect (``suspect_cap``: half of what the claim left, rounded up) and is not
    charged the attempt (its budget grows by one); :func:`~triage.jobs.sql.moves.worker.claim_batch`
    then claims suspects only with suspects, at most ``suspect_cap`` at a time, so the groups
    halve death after death. A suspect that dies alone in its claim is ``poison``: to review. A
    clean job that dies alone becomes a suspect of one (and is charged the attempt, as before);
    ``retries_exhausted`` and ``lease_expired_repeatedly`` still apply to it. Dead claims are
    counted among the rows this statement takes (``:limit``): a claim split across two releases
    gets smaller caps, never larger.
    """
    earlier_try = sa.and_(
        sa.func.starts_with(jobs.c.lease_owner, sa.bindparam("owner_prefix", type_=sa.Text)),
        jobs.c.lease_owner != sa.bindparam("owner", type_=sa.Text),
    )
    in_batch = sa.or_(
        sa.bindparam("p_batch_key", type_=sa.Text).is_(None),
        jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
    )
    expired_now = sa.and_(
        jobs.c.status == status_literal(S.RUNNING),
        in_batch,
        sa.or_(jobs.c.lease_expires_at < NOW, sa.func.coalesce(earlier_try, False)),
    )
    expired = (
        sa.select(jobs.c.id, jobs.c.lease_token)
        .where(expired_now)
        .order_by(jobs.c.lease_expires_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .with_for_update(skip_locked=True)
        .cte("expired")
    )
    # Poison isolation: the unfinished jobs each dead claim (lease token) left, counted here.
    dead = sa.select(expired.c.lease_token, sa.func.count().label("left")).group_by(expired.c.lease_token).cte("dead")
    shared = dead.c.left > 1
    spent = jobs.c.attempt >= jobs.c.max_attempts
    too_often = jobs.c.lease_rescues >= sa.bindparam("max_rescues", type_=sa.Integer)
    review_reason = sa.case(
        (shared, None),
        (jobs.c.suspect_cap.is_not(None), POISON),
        (spent, "retries_exhausted"),
        (too_often, "lease_expired_repeatedly"),
        else_=None,
    )
    moved = (
        sa.update(jobs)
        .where(jobs.c.id == expired.c.id, dead.c.lease_token == jobs.c.lease_token, expired_now)
        .values(
            status=sa.case(
                (review_reason.is_not(None), status_literal(S.MANUAL_REVIEW)), else_=status_literal(S.RETRYABLE_FAILED)
            ),
            status_reason=sa.func.coalesce(review_reason, "lease_expired"),
            next_attempt_at=sa.case((review_reason.is_not(None), None), else_=NOW),
            # A death shared with other jobs is not charged to this one (any of them may have
            # caused it): its budget grows by the attempt (attempts only grow: each claim keeps
            # its own number) and its next claim is half as large.
            max_attempts=sa.case((shared, jobs.c.max_attempts + 1), else_=jobs.c.max_attempts),
            suspect_cap=sa.func.least(jobs.c.suspect_cap, (dead.c.left + 1) // 2),
            lease_rescues=jobs.c.lease_rescues + 1,
            last_error_class="lease_expired",
            last_error=sa.case(
                (
                    jobs.c.lease_expires_at < NOW,
                    sa.func.concat("lease of ", jobs.c.lease_owner, " expired at ", jobs.c.lease_expires_at),
                ),
                else_=sa.func.concat("lease of ", jobs.c.lease_owner, " taken back by a retry of its task"),
            ),
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
        .cte("moved")
    )
    context = sa.func.jsonb_build_object("lease_expired", True)
    return sa.select(moved.c.id, moved.c.status).add_cte(*E.entered_review(moved, context=context))


def _last_actor() -> Any:
    """Who made the job's latest move (``job_events``, newest first by its index)."""
    return (
        sa.select(job_events.c.actor)
        .where(job_events.c.job_id == jobs.c.id)
        .order_by(job_events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


@cache
def send_batch_to_review() -> Any:
    """Move a batch's unfinished jobs to ``manual_review`` (the failure callback; reconciliation
    for a batch whose runs are all over).

    Takes running jobs whose lease belongs to ``:owner_prefix`` (the task that failed) or has
    expired, and, with ``:take_unleased``, the jobs nobody holds; a live lease of another
    worker is left alone. A failed map index of a mapped task passes ``take_unleased=false``:
    the unleased jobs are its siblings' work while any of them still runs.

    ``:run_prefix`` (``dag/run/``; NULL: any run) confines it to one DAG run's work, since
    several runs of one date share a batch: an expired lease only of that run, an unleased job
    only if that run made its latest move (registered, released, retried or advanced it). A job
    another run touched last, or a reviewer requeued, is not this run's to give up.
    ``:p_step`` (NULL: every step) keeps it to the step of the task that failed.

    Jobs parked on an outage (``waiting``, reason ``outage:…``, :mod:`.outages`) are never taken:
    the task failed because a dependency is down, not because of them, and the next claim of
    their batch takes them up again once it is back.
    """
    open_states = [status_literal(s) for s in sorted(UNLEASED)]
    run_prefix = sa.bindparam("run_prefix", type_=sa.Text)
    step = sa.bindparam("p_step", type_=sa.Text)
    target = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            sa.or_(step.is_(None), jobs.c.step == step),
            sa.or_(
                sa.and_(
                    sa.bindparam("take_unleased", type_=sa.Boolean),
                    jobs.c.status.in_(open_states),
                    sa.not_(parked()),
                    sa.or_(run_prefix.is_(None), sa.func.starts_with(_last_actor(), run_prefix)),
                ),
                sa.and_(
                    jobs.c.status == status_literal(S.RUNNING),
                    sa.or_(
                        sa.func.starts_with(jobs.c.lease_owner, sa.bindparam("owner_prefix", type_=sa.Text)),
                        sa.and_(
                            jobs.c.lease_expires_at < NOW,
                            sa.or_(run_prefix.is_(None), sa.func.starts_with(jobs.c.lease_owner, run_prefix)),
                        ),
                    ),
                ),
            ),
        )
        .with_for_update(skip_locked=True)
        .cte("target")
    )
    moved = (
        sa.update(jobs)
        .where(jobs.c.id == target.c.id)
        .values(
            status=status_literal(S.MANUAL_REVIEW),
            status_reason=sa.bindparam("reason", type_=sa.Text),
            last_error_class=sa.bindparam("reason", type_=sa.Text),
            last_error=sa.bindparam("error", type_=sa.Text),
            next_attempt_at=None,
            updated_at=NOW,
            **NO_LEASE,
        )
        .returning(*MOVED)
        .cte("moved")
    )
    context = sa.cast(sa.bindparam("context", type_=sa.Text), pg.JSONB)
    return sa.select(moved.c.id, moved.c.status).add_cte(*E.entered_review(moved, context=context))
