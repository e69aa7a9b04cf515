"""Intake on the ledger: accept documents posted over HTTP, measure the work they wait behind, and
tell a client where its document is. No Airflow imports.

:class:`IntakeLedger` is part of :class:`~triage.jobs.store.JobStore` (callers ask the store).
Accepting is the retrieval step's registration (``INSERT … ON CONFLICT (idempotency_key) DO
NOTHING``, job and ``job.registered`` outbox event together, the trigger logging each new job)
and the answer for every key, in one statement (:func:`accept_jobs`) that is its own
transaction: one round trip a request, set-based whatever the batch's size. A key registered
before answers with the job it already has, read in the same statement; one whose conflicting
row committed after the statement's snapshot (a concurrent request's) is read once more, after
the commit (:func:`jobs_by_key`).
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.contracts.intake import INTAKE_BATCH
from triage.jobs.errors import translate
from triage.jobs.expressions import UUID, event_ids, outbox_insert, recordset, rowset, status_literal
from triage.jobs.ledger import Ledger
from triage.jobs.models import NewJob
from triage.jobs.schema import classifications, document_labels, jobs, manual_review
from triage.jobs.states import UNFINISHED, EventType
from triage.jobs.states import JobStatus as S
from triage.jobs.transitions import NEW_JOB_COLUMNS


@dataclass(frozen=True, slots=True)
class Accepted:
    """One document's job: ``new`` when this call registered it."""

    idempotency_key: str
    job_id: uuid.UUID
    status: str
    correlation_id: str
    new: bool


@dataclass(frozen=True, slots=True)
class IntakeStatus:
    """Where a job is, for the client that posted its document."""

    job_id: uuid.UUID
    source: str
    external_id: str
    correlation_id: str
    status: str
    step: str
    attempt: int
    label: str | None
    confidence: float | None
    review_reason: str | None
    last_error_class: str | None
    created_at: datetime
    updated_at: datetime


GIVEN_COLUMNS = dict(NEW_JOB_COLUMNS, event_id=UUID)
"""A registered job's columns (as the batch registration's) and its ``job.registered`` event's id."""


@cache
def accept_jobs() -> Any:
    """Register the given jobs as ``queued`` (``ON CONFLICT (idempotency_key) DO NOTHING``) with
    their ``job.registered`` events, and answer each given key's job: the new one, or the one
    the key had (in the statement's snapshot; none when it committed after it).

    ``:actor`` is set for the jobs trigger (``set_config(…, true)``: it ends with the statement's
    own transaction) by a CTE the insert reads, so it is set before any row is inserted, and the
    trigger (``AFTER … FOR EACH STATEMENT``) fires after the whole statement. A job's id and its
    event's id come with the rows (UUIDv7, :func:`~triage.jobs.expressions.event_ids`); its
    correlation id, when the client sent none, is its id as PostgreSQL writes a uuid (as ``str``
    of a Python ``UUID``).
    """
    given = sa.select(recordset("given", **GIVEN_COLUMNS)).cte("given")
    actor = sa.select(sa.func.set_config("triage.actor", sa.bindparam("actor", type_=sa.Text), True).label("a")).cte(
        "actor"
    )
    inserted = (
        pg.insert(jobs)
        .from_select(
            [
                "id",
                "idempotency_key",
                "source",
                "external_id",
                "content_sha256",
                "payload_ref",
                "classifier_version",
                "correlation_id",
                "batch_key",
                "step",
                "status",
                "status_reason",
                "max_attempts",
            ],
            sa.select(
                given.c.id,
                given.c.idempotency_key,
                given.c.source,
                given.c.external_id,
                given.c.content_sha256,
                given.c.payload_ref,
                given.c.classifier_version,
                sa.func.coalesce(given.c.correlation_id, sa.cast(given.c.id, sa.Text)),
                sa.bindparam("batch_key", type_=sa.Text),
                sa.bindparam("step", type_=sa.Text),
                status_literal(S.QUEUED),
                sa.literal("registered"),
                sa.bindparam("max_attempts", type_=sa.Integer),
            ).select_from(given.join(actor, sa.true())),
        )
        .on_conflict_do_nothing(index_elements=["idempotency_key"])
        .returning(jobs.c.id, jobs.c.attempt, jobs.c.idempotency_key, jobs.c.status, jobs.c.correlation_id)
        .cte("inserted")
    )
    registered = (
        sa.select(given.c.event_id, inserted.c.id, inserted.c.attempt)
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
    Executed with ``exec_driver_sql``; its parameters are plain text and integers, which need
    no bind processing.
    """
    from sqlalchemy.dialects.postgresql import psycopg

    done = statement.compile(dialect=psycopg.dialect())
    return done.string, dict(done.params)


@cache
def jobs_by_key() -> Any:
    """The job of each idempotency key (the unique index on ``idempotency_key`` serves it)."""
    return sa.select(jobs.c.idempotency_key, jobs.c.id, jobs.c.status, jobs.c.correlation_id).where(
        jobs.c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
    )


@cache
def unfinished_depth() -> Any:
    """How many jobs of a batch are unfinished (``received``, ``queued``, ``running``,
    ``waiting``, ``retryable_failed``: :data:`~triage.jobs.states.UNFINISHED`, whatever their
    step), counted up to ``:bound`` only (the backpressure check needs no more). Parked work
    counts: a model outage parks intake's jobs in ``waiting``, and a depth of queued jobs alone
    let every outage cycle take another bound's worth (issue #25). One scan of the batch's
    entries of ``jobs_batch_key_status_idx`` that stops after ``bound``, whatever the table holds
    (tests/ledger/test_intake.py reads the plan)."""
    unfinished = (
        sa.select(sa.literal(1))
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            jobs.c.status.in_([status_literal(s) for s in sorted(UNFINISHED)]),
        )
        .limit(sa.bindparam("bound", type_=sa.Integer))
        .subquery()
    )
    return sa.select(sa.func.count()).select_from(unfinished)


@cache
def intake_status() -> Any:
    """One job's state, its label (the document's label written by this job, else its latest
    accepted classification) and its open review's reason."""
    answer = (
        sa.select(classifications.c.label, classifications.c.confidence)
        .where(classifications.c.job_id == jobs.c.id, classifications.c.outcome == "accepted")
        .order_by(classifications.c.attempt.desc())
        .limit(1)
        .lateral("answer")
    )
    review = (
        sa.select(manual_review.c.reason)
        .where(manual_review.c.job_id == jobs.c.id, manual_review.c.resolved_at.is_(None))
        .limit(1)
        .lateral("review")
    )
    stored = document_labels.alias("stored")
    return (
        sa.select(
            jobs.c.id,
            jobs.c.source,
            jobs.c.external_id,
            jobs.c.correlation_id,
            jobs.c.status,
            jobs.c.step,
            jobs.c.attempt,
            sa.func.coalesce(stored.c.label, answer.c.label).label("label"),
            sa.func.coalesce(stored.c.confidence, answer.c.confidence).label("confidence"),
            review.c.reason,
            jobs.c.last_error_class,
            jobs.c.created_at,
            jobs.c.updated_at,
        )
        .select_from(
            jobs.outerjoin(stored, stored.c.job_id == jobs.c.id)
            .outerjoin(answer, sa.true())
            .outerjoin(review, sa.true())
        )
        .where(jobs.c.id == sa.bindparam("job_id", type_=UUID))
    )


def _value(status: Any) -> str:
    return str(getattr(status, "value", status))


class IntakeLedger(Ledger):
    """Intake's part of the store (:class:`~triage.jobs.store.JobStore` inherits it)."""

    def accept(
        self, new_jobs: Sequence[NewJob], *, step: str, max_attempts: int, actor: str, batch_key: str = INTAKE_BATCH
    ) -> list[Accepted]:
        """Register each document's job (job and outbox event) and answer every key's job, in
        one statement that is its own transaction (:func:`accept_jobs`); one :class:`Accepted`
        per distinct key, in the order given."""
        if max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        first: dict[str, NewJob] = {}
        for job in new_jobs:
            first.setdefault(job.idempotency_key, job)
        ids = event_ids(2 * len(first))
        rows = rowset(
            "given",
            (
                {
                    "id": ids[2 * i],
                    "event_id": ids[2 * i + 1],
                    "idempotency_key": j.idempotency_key,
                    "source": j.source,
                    "external_id": j.external_id,
                    "content_sha256": j.content_sha256,
                    "payload_ref": j.payload_ref,
                    "classifier_version": j.classifier_version,
                    "correlation_id": j.correlation_id,
                }
                for i, j in enumerate(first.values())
            ),
        )
        sql, constants = compiled(accept_jobs())
        params = {
            **constants,
            **rows,
            "actor": actor,
            "batch_key": batch_key,
            "step": step,
            "max_attempts": max_attempts,
        }
        try:
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                answered = {
                    r.idempotency_key: Accepted(r.idempotency_key, r.id, _value(r.status), r.correlation_id, r.new)
                    for r in conn.exec_driver_sql(sql, params)
                    if r.id is not None
                }
                missing = [k for k in first if k not in answered]
                if missing:  # registered by a request that committed after this statement began
                    for r in conn.execute(jobs_by_key(), {"keys": missing}):
                        answered[r.idempotency_key] = Accepted(
                            r.idempotency_key, r.id, _value(r.status), r.correlation_id, False
                        )
        except sa.exc.DBAPIError as exc:
            ledger_error = translate(exc)
            if ledger_error is not None:
                raise ledger_error from exc
            raise
        return [answered[k] for k in first]

    def unfinished_depth(self, *, bound: int, batch_key: str = INTAKE_BATCH) -> int:
        """Unfinished jobs of the batch, counted up to ``bound`` (:func:`unfinished_depth`)."""
        with self.reading() as conn:
            return int(conn.execute(unfinished_depth(), {"p_batch_key": batch_key, "bound": bound}).scalar_one())

    def intake_status(self, job_id: uuid.UUID) -> IntakeStatus | None:
        with self.reading() as conn:
            row = conn.execute(intake_status(), {"job_id": job_id}).first()
        if row is None:
            return None
        return IntakeStatus(
            row.id,
            row.source,
            row.external_id,
            row.correlation_id,
            _value(row.status),
            row.step,
            row.attempt,
            row.label,
            row.confidence,
            row.reason,
            row.last_error_class,
            row.created_at,
            row.updated_at,
        )
