"""The half-open probe of an outage: one parked job asks the dependency before the park delay is
over, and when it answers, the rest of the parked work is queued at once. Named SQLAlchemy Core
statements (fenced, like every move); the store's part that runs them is
:class:`triage.jobs.store.probes.OutageProbes` (``JobStore.probes``).

Work parked on an outage (:mod:`.outages`: ``waiting``, reason ``outage:<dependency>``, due at
``next_attempt_at``) used to wait out its whole delay even when the dependency was back within
seconds: a run that found nothing due only failed its try (up to an hour later, the delay
doubles with each parking). A step that finds nothing to claim but parked work not yet due
probes instead (:mod:`triage.pipeline.steps`): it takes one parked job (:func:`probe_parked`),
claims it and makes its call. Answered, the dependency is back and :func:`resume_after_probe`
queues every job of the batch and step parked on it; failing again, the probe job is parked
again (its attempt given back) and the rest keep their due time.

At most one prober at a time per batch and step: a probe is taken only when nothing of the
batch and step is queued, due, or running under a live lease (someone is working: their calls
are the probe), under a transaction-level advisory lock on the batch and step so that two
workers cannot both see that at once.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import jobs
from triage.jobs.sql.expressions import NOW, parked, status_literal
from triage.jobs.vocabulary.states import OUTAGE_PREFIX
from triage.jobs.vocabulary.states import JobStatus as S

PROBE = "outage_probe"
"""The ``status_reason`` of the parked job taken out as the probe (logged in ``job_events``)."""
PROBE_ANSWERED = "probe_answered"
"""The ``status_reason`` of the parked jobs queued at once because the probe was answered."""
PROBED = ("model", "payload_store", "label_provider")
"""The dependencies a probe asks: those a step's circuit breaker parks work on. Never
``outage:batch`` (a provider batch is answering those jobs: a call would pay for them twice) nor
``outage:rate_limit`` (the shared budget, not the dependency, decides when they go)."""
LOCK_CLASS = 0x7072  # "pr": the probes' advisory locks, keyed by (this, hashtext(batch/step))


def _in_step(table: Any) -> list[ColumnElement[bool]]:
    """``table``'s row is of the batch, step and classifier version (NULL: any) asked for."""
    version = sa.bindparam("p_classifier_version", type_=sa.Text)
    return [
        table.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
        table.c.step == sa.bindparam("p_step", type_=sa.Text),
        sa.or_(version.is_(None), table.c.classifier_version == version),
    ]


@cache
def probe_lock() -> Any:
    """Serialise the probes of one batch and step for the rest of the transaction."""
    key = sa.func.hashtext(
        sa.func.concat(sa.bindparam("p_batch_key", type_=sa.Text), "/", sa.bindparam("p_step", type_=sa.Text))
    )
    return sa.select(sa.func.pg_advisory_xact_lock(LOCK_CLASS, key))


def busy() -> ColumnElement[bool]:
    """Some job of the batch and step is claimable now or held under a live lease: a claim will
    take it, or a worker is calling the dependency already."""
    other = jobs.alias("other")
    return sa.exists().where(
        *_in_step(other),
        sa.or_(
            other.c.status == status_literal(S.QUEUED),
            sa.and_(other.c.status == status_literal(S.RETRYABLE_FAILED), other.c.next_attempt_at <= NOW),
            sa.and_(other.c.status == status_literal(S.RUNNING), other.c.lease_expires_at >= NOW),
        ),
    )


@cache
def probe_parked() -> Any:
    """``waiting -> queued`` (reason :data:`PROBE`) for one job of a batch and step parked on an
    outage of a :data:`PROBED` dependency, the soonest due, unless the batch and step are :func:`busy`. Returns its id and the
    dependency it was parked on (``outage:<dependency>``, before the move)."""
    target = (
        sa.select(jobs.c.id, jobs.c.status_reason)
        .where(*_in_step(jobs), parked(), jobs.c.status_reason.in_([OUTAGE_PREFIX + d for d in PROBED]))
        .order_by(jobs.c.next_attempt_at, jobs.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .cte("target")
    )
    dependency = sa.func.substr(target.c.status_reason, len(OUTAGE_PREFIX) + 1)
    return (
        sa.update(jobs)
        .where(jobs.c.id == target.c.id, parked(), ~busy())
        .values(status=status_literal(S.QUEUED), status_reason=PROBE, next_attempt_at=None, updated_at=NOW)
        .returning(jobs.c.id, dependency.label("dependency"))
    )


@cache
def resume_after_probe() -> Any:
    """``waiting -> queued`` (reason :data:`PROBE_ANSWERED`) for every job of a batch and step
    parked on an outage of ``:dependency``, due or not: the probe was answered."""
    target = (
        sa.select(jobs.c.id)
        .where(
            *_in_step(jobs),
            parked(),
            jobs.c.status_reason == sa.func.concat(OUTAGE_PREFIX, sa.bindparam("dependency", type_=sa.Text)),
        )
        .with_for_update(skip_locked=True)
        .cte("target")
    )
    return (
        sa.update(jobs)
        .where(jobs.c.id == target.c.id, parked())
        .values(status=status_literal(S.QUEUED), status_reason=PROBE_ANSWERED, next_attempt_at=None, updated_at=NOW)
        .returning(jobs.c.id)
    )
