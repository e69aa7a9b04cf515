"""Intake on the ledger: accept documents posted over HTTP, measure the queue they wait in, and
tell a client where its document is. No Airflow imports.

:class:`IntakeLedger` is part of :class:`~triage.jobs.store.JobStore` (callers ask the store).
Accepting is the retrieval step's registration (:func:`~triage.jobs.recording.register_txn`:
``INSERT … ON CONFLICT (idempotency_key) DO NOTHING``, job and outbox event together) followed,
in the same transaction, by a read of every key's job: a key registered before, by an earlier
request or a concurrent one that committed first, answers with the job it already has. Under
READ COMMITTED the read is a new snapshot, so it sees the row whose conflict skipped the insert.
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
from triage.jobs.expressions import UUID, status_literal
from triage.jobs.ledger import Ledger
from triage.jobs.models import NewJob
from triage.jobs.recording import register_txn
from triage.jobs.schema import classifications, document_labels, jobs, manual_review
from triage.jobs.states import JobStatus as S


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


@cache
def jobs_by_key() -> Any:
    """The job of each idempotency key (the unique index on ``idempotency_key`` serves it)."""
    return sa.select(jobs.c.idempotency_key, jobs.c.id, jobs.c.status, jobs.c.correlation_id).where(
        jobs.c.idempotency_key == sa.any_(sa.bindparam("keys", type_=pg.ARRAY(sa.Text)))
    )


@cache
def queued_depth() -> Any:
    """How many jobs of a batch and step are queued and not yet claimed, counted up to ``:bound``
    only (the backpressure check needs no more): one index scan of the batch's entries that stops
    after ``bound``, whatever the table holds. ``jobs_claimable_idx`` answers it alone (its
    predicate names the claimable states, and a queued job has no ``next_attempt_at``: the
    ``next_attempt_only_while_retryable_or_parked`` check); the planner may take
    ``jobs_batch_key_status_idx`` instead, as bounded (tests/integration/test_intake.py)."""
    queued = (
        sa.select(sa.literal(1))
        .where(
            jobs.c.batch_key == sa.bindparam("p_batch_key", type_=sa.Text),
            jobs.c.step == sa.bindparam("p_step", type_=sa.Text),
            jobs.c.status.in_([status_literal(S.QUEUED), status_literal(S.RETRYABLE_FAILED)]),
            jobs.c.next_attempt_at.is_(None),
        )
        .limit(sa.bindparam("bound", type_=sa.Integer))
        .subquery()
    )
    return sa.select(sa.func.count()).select_from(queued)


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
        """Register each document's job (job and outbox event) and read back every key's job,
        in one transaction; one :class:`Accepted` per distinct key, in the order given."""
        keys = list(dict.fromkeys(j.idempotency_key for j in new_jobs))
        first: dict[str, NewJob] = {}
        for job in new_jobs:
            first.setdefault(job.idempotency_key, job)
        with self.transaction(actor) as conn:
            registered = register_txn(
                conn, [first[k] for k in keys], batch_key=batch_key, step=step, max_attempts=max_attempts
            )
            rows = {r.idempotency_key: r for r in conn.execute(jobs_by_key(), {"keys": keys})}
        new = set(registered.new_ids)
        return [
            Accepted(k, rows[k].id, _value(rows[k].status), rows[k].correlation_id, rows[k].id in new) for k in keys
        ]

    def queued_depth(self, *, step: str, bound: int, batch_key: str = INTAKE_BATCH) -> int:
        """Queued, unclaimed jobs of the batch and step, counted up to ``bound``."""
        with self.reading() as conn:
            return int(
                conn.execute(queued_depth(), {"p_batch_key": batch_key, "p_step": step, "bound": bound}).scalar_one()
            )

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
