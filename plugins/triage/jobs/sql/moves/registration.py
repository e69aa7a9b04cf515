"""Registration: new jobs enter the ledger by one statement, ``INSERT … ON CONFLICT
(idempotency_key) DO NOTHING`` (:func:`new_jobs`), whoever registers them.

The idempotency key is the logical operation (source, external id, content hash, classifier
version): a key seen before registers nothing, so re-running a date, or a client posting the
same document again, is free. Each registration inserts its job and its ``job.registered``
outbox event in the same statement. Retrieval registers a batch as ``queued``
(:func:`register_queued`) and input malformed on arrival straight into ``manual_review`` with
its review row (:func:`register_for_review`); intake registers what a client posted and answers
every key with its job, new or not (:func:`accept_jobs`).

Nothing here executes anything: :class:`~triage.jobs.store.JobStore` (``register``) and its
intake part (:mod:`triage.jobs.store.intake`) run these.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import jobs, manual_review, outbox
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import EVENT_COLUMNS, MOVED, UUID, outbox_insert, recordset, status_literal
from triage.jobs.vocabulary.states import EventType
from triage.jobs.vocabulary.states import JobStatus as S

NEW_JOB_COLUMNS = dict(
    id=UUID,
    idempotency_key=sa.Text,
    source=sa.Text,
    external_id=sa.Text,
    content_sha256=sa.Text,
    payload_ref=sa.Text,
    classifier_version=sa.Text,
    correlation_id=sa.Text,
)
"""A new job's own columns, as a registration's rows carry them."""
GIVEN_COLUMNS = dict(NEW_JOB_COLUMNS, event_id=UUID)
"""A registered job's columns and its ``job.registered`` event's id (intake's rows)."""


def new_jobs(
    rows: Any,
    status: S,
    reason: ColumnElement[Any],
    returning: Sequence[ColumnElement[Any]],
    *,
    given: Mapping[str, ColumnElement[Any]] | None = None,
    errors: Mapping[str, ColumnElement[Any]] | None = None,
    from_: Any = None,
) -> Any:
    """The ledger's one registration: INSERT the jobs of ``rows`` (a recordset or CTE with the
    columns of :data:`NEW_JOB_COLUMNS`) in ``status`` with ``status_reason`` ``reason``, into the
    batch ``:batch_key`` at step ``:step`` with ``:max_attempts``, ``ON CONFLICT
    (idempotency_key) DO NOTHING``; a CTE named ``inserted`` of the new jobs' ``returning``.

    :param given: a job column's value other than the row's own (intake's correlation id).
    :param errors: ``last_error_class``/``last_error`` of a job registered already failed.
    :param from_: what the rows are selected from, when more than ``rows`` (intake's actor).
    """
    values: dict[str, Any] = {name: rows.c[name] for name in NEW_JOB_COLUMNS}
    values.update(given or {})
    values.update(
        batch_key=sa.bindparam("batch_key", type_=sa.Text),
        step=sa.bindparam("step", type_=sa.Text),
        status=status_literal(status),
        status_reason=reason,
        **(errors or {}),
        max_attempts=sa.bindparam("max_attempts", type_=sa.Integer),
    )
    selected = sa.select(*values.values())
    if from_ is not None:
        selected = selected.select_from(from_)
    return (
        pg.insert(jobs)
        .from_select(list(values), selected)
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(*returning)
        .cte("inserted")
    )


@cache
def register_queued() -> Any:
    """Register new jobs as ``queued`` with their ``job.registered`` outbox events (retrieval).
    Returns the ids of the new jobs only."""
    new = recordset("new", **NEW_JOB_COLUMNS)
    inserted = new_jobs(new, S.QUEUED, sa.literal("registered"), EVENT_COLUMNS)
    return outbox_insert(inserted, EventType.REGISTERED).returning(outbox.c.job_id)


@cache
def register_for_review() -> Any:
    """Register input that was malformed on arrival straight into ``manual_review``, with its
    review row and its outbox event: nothing is lost, and a human sees why."""
    new = recordset("new", **NEW_JOB_COLUMNS, reason=sa.Text, error=sa.Text, context=sa.Text)
    errors = {"last_error_class": new.c.reason, "last_error": new.c.error}
    inserted = new_jobs(new, S.MANUAL_REVIEW, new.c.reason, MOVED, errors=errors)
    reviews = (
        sa.insert(manual_review)
        .from_select(
            ["job_id", "reason", "error_class", "attempts", "last_error", "context"],
            sa.select(
                inserted.c.id, new.c.reason, new.c.reason, sa.literal(0), new.c.error, sa.cast(new.c.context, pg.JSONB)
            ).join_from(inserted, new, new.c.id == inserted.c.id),
        )
        .cte("reviews")
    )
    events = E.needs_review(inserted)
    return outbox_insert(inserted, EventType.REGISTERED).returning(outbox.c.job_id).add_cte(reviews, events)


@cache
def accept_jobs() -> Any:
    """Register the given jobs as ``queued`` (``ON CONFLICT (idempotency_key) DO NOTHING``) with
    their ``job.registered`` events, and answer each given key's job: the new one, or the one
    the key had (in the statement's snapshot; none when it committed after it).

    ``:actor`` is set for the jobs trigger (``set_config(…, true)``: it ends with the statement's
    own transaction) by a CTE the insert reads, so it is set before any row is inserted, and the
    trigger (``AFTER … FOR EACH STATEMENT``) fires after the whole statement. A job's id and its
    event's id come with the rows (UUIDv7, :func:`~triage.jobs.sql.expressions.event_ids`); its
    correlation id, when the client sent none, is its id as PostgreSQL writes a uuid (as ``str``
    of a Python ``UUID``).
    """
    given = sa.select(recordset("given", **GIVEN_COLUMNS)).cte("given")
    actor = sa.select(sa.func.set_config("triage.actor", sa.bindparam("actor", type_=sa.Text), True).label("a")).cte(
        "actor"
    )
    inserted = new_jobs(
        given,
        S.QUEUED,
        sa.literal("registered"),
        (jobs.c.id, jobs.c.attempt, jobs.c.idempotency_key, jobs.c.status, jobs.c.correlation_id),
        given={"correlation_id": sa.func.coalesce(given.c.correlation_id, sa.cast(given.c.id, sa.Text))},
        from_=given.join(actor, sa.true()),
    )
    registered = (
        sa.select(given.c.event_id, inserted.c.id, inserted.c.attempt, inserted.c.correlation_id, given.c.payload_ref)
        .join_from(inserted, given, given.c.id == inserted.c.id)
        .cte("registered")
    )
    events = outbox_insert(registered, EventType.REGISTERED).cte("events")
    # A key that inserted nothing had its job already: looked up by the unique index, for
    # those keys only (the lookup's one-time filter skips it for a new job). LIMIT 1 (a key
    # has one job) keeps the planner from flattening the lookup into a join over the table.
    known = (
        sa.select(jobs.c.id, jobs.c.status, jobs.c.correlation_id)
        .where(jobs.c.idempotency_key == given.c.idempotency_key, inserted.c.id.is_(None))
        .limit(1)
        .lateral("known")
    )
    return (
        sa.select(
            given.c.idempotency_key,
            sa.func.coalesce(inserted.c.id, known.c.id).label("id"),
            sa.func.coalesce(inserted.c.status, known.c.status).label("status"),
            sa.func.coalesce(inserted.c.correlation_id, known.c.correlation_id).label("correlation_id"),
            inserted.c.id.is_not(None).label("new"),
        )
        .select_from(
            given.outerjoin(inserted, inserted.c.idempotency_key == given.c.idempotency_key).outerjoin(known, sa.true())
        )
        .add_cte(events)
    )


@cache
def compiled(statement: Any) -> tuple[str, dict[str, Any]]:
    """``statement`` compiled once for psycopg: its SQL text and its constant parameters.

    SQLAlchemy never caches the compiled form of a PostgreSQL ``INSERT … ON CONFLICT`` (its
    ``Insert`` is ``inherit_cache = False``), so :func:`accept_jobs` would be compiled again
    for every request: ~2 ms of the API server's CPU, a tenth of what a batch of 100 costs.
    The same holds for every statement with such an insert (registration, the classifications,
    the labels, a move to review): :func:`triage.jobs.store.recording.execute_compiled` runs
    them from here. Executed with ``exec_driver_sql``; their parameters are plain text and
    integers, which need no bind processing.
    """
    from sqlalchemy.dialects.postgresql import psycopg

    done = statement.compile(dialect=psycopg.dialect())
    return done.string, dict(done.params)
