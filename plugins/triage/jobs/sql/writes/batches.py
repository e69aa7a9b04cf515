"""The provider batches a backfill's jobs wait on (``model_batches``, ``model_batch_answers``:
migration 0017), as named SQLAlchemy Core statements. The jobs' own move (made due once their
batch is collected or lost) is :func:`triage.jobs.sql.moves.outages.make_batch_due`.

Nothing here executes anything: the store's batch part (:mod:`triage.jobs.store.batches`) runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import jobs, model_batch_answers, model_batches

OPEN = ("submitting", "running")
"""A submission's states while the provider may still answer it."""


@cache
def open_submission() -> Any:
    """Write a submission (its row's columns as parameters: ``key``, ``batch_key``, …; written
    ``submitting``) unless an earlier try wrote it."""
    return pg.insert(model_batches).on_conflict_do_nothing(index_elements=["key"])


@cache
def submission(lock: bool = False) -> Any:
    """The submission ``:p_key`` (``lock``: held until the transaction ends)."""
    query = sa.select(model_batches).where(model_batches.c.key == sa.bindparam("p_key", type_=sa.Text))
    return query.with_for_update() if lock else query


@cache
def mark_running() -> Any:
    """The provider accepted the submission ``:p_key`` as ``:p_provider_batch_id``."""
    return (
        sa.update(model_batches)
        .where(model_batches.c.key == sa.bindparam("p_key", type_=sa.Text), model_batches.c.status.in_(OPEN))
        .values(provider_batch_id=sa.bindparam("p_provider_batch_id", type_=sa.Text), status="running")
    )


def _submissions(*where: Any) -> Any:
    """The run ``:p_batch_key``'s submissions that match ``where``, oldest first."""
    return (
        sa.select(model_batches)
        .where(model_batches.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text), *where)
        .order_by(model_batches.c.submitted_at)
    )


@cache
def open_submissions() -> Any:
    """The run's submissions still running (or never accepted by the provider)."""
    return _submissions(model_batches.c.status.in_(OPEN))


@cache
def unaccepted_submissions() -> Any:
    """The run's submissions that never got the provider's id and whose jobs nobody holds under
    a live lease (a live lease: a try is writing the submission right now)."""
    live = (
        sa.select(jobs.c.id)
        .where(
            jobs.c.id == sa.any_(model_batches.c.job_ids),
            jobs.c.status == "running",
            jobs.c.lease_expires_at > sa.func.now(),
        )
        .exists()
    )
    return _submissions(model_batches.c.status == "submitting", model_batches.c.provider_batch_id.is_(None), ~live)


@cache
def record_answers() -> Any:
    """A collected batch's answers (``model_batch_answers`` rows), each kept once."""
    return pg.insert(model_batch_answers).on_conflict_do_nothing()


@cache
def finish_submission() -> Any:
    """The submission ``:p_key`` is over: ``:p_status`` ``collected`` or ``lost``."""
    return (
        sa.update(model_batches)
        .where(model_batches.c.key == sa.bindparam("p_key", type_=sa.Text))
        .values(status=sa.bindparam("p_status", type_=sa.Text), finished_at=sa.func.now())
    )


@cache
def batch_answers() -> Any:
    """The answers (no failed request) recorded for the jobs ``:ids``, by attempt."""
    a = model_batch_answers
    return (
        sa.select(a)
        .where(a.c.job_id.in_(sa.bindparam("ids", expanding=True)), a.c.error_class.is_(None))
        .order_by(a.c.attempt)
    )
