"""Intake on the ledger: accept documents posted over HTTP, measure the work they wait behind, and
tell a client where its document is. No Airflow imports.

:class:`IntakeLedger` is the store's part ``JobStore.intake`` (callers ask ``store.intake``).
Accepting is the retrieval step's registration (``INSERT … ON CONFLICT (idempotency_key) DO
NOTHING``, job and ``job.registered`` outbox event together, the trigger logging each new job)
and the answer for every key, in one statement (:func:`accept_jobs`) that is its own
transaction: one round trip a request, set-based whatever the batch's size. A key registered
before answers with the job it already has, read in the same statement; one whose conflicting
row committed after the statement's snapshot (a concurrent request's) is read once more, after
the commit (:func:`jobs_by_key`). The statements are :mod:`triage.jobs.sql.moves.registration`
(the same registration as retrieval's) and :mod:`triage.jobs.sql.reads.intake`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from triage.contracts.intake import INTAKE_BATCH
from triage.jobs.sql.expressions import event_ids, rowset
from triage.jobs.sql.moves.registration import accept_jobs
from triage.jobs.sql.reads.intake import intake_status, jobs_by_key, unfinished_depth
from triage.jobs.store.ledger import Part
from triage.jobs.store.recording import execute_compiled
from triage.jobs.vocabulary.errors import translate
from triage.jobs.vocabulary.models import NewJob


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


def _value(status: Any) -> str:
    return str(getattr(status, "value", status))


class IntakeLedger(Part):
    """Intake's part of the store: ``JobStore.intake``."""

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
        params = {
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
                    for r in execute_compiled(conn, accept_jobs(), params)
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
