"""The provider batches a backfill's jobs wait on, in the ledger (migration 0017).

A submission is a row of ``model_batches`` named by its ``key`` and written *before* the provider
is asked (``submitting``), then given the provider's id (``running``). Its jobs are parked while
it runs (``waiting``, reason ``outage:batch``, the attempt given back, due at the end of the
provider's completion window: if nobody ever collects the batch, they come back to the queue by
themselves). Collecting it writes each answer to ``model_batch_answers`` (job, attempt) and makes
the batch's parked jobs due now; the classify step queues them, claims them (counting the same
attempt again) and takes each one's answer instead of calling the model. A batch the provider
lost is marked ``lost`` and its jobs are made due the same way, with no answers: they are asked
again.

Nothing here calls the provider: :mod:`triage.pipeline.batch_mode` does, and runs these.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import jobs, model_batch_answers, model_batches
from triage.jobs.store.ledger import Ledger

__all__ = ["BATCH_REASON", "BatchLedger", "Submission"]

BATCH_REASON = "outage:batch"
"""The ``status_reason`` of a job waiting on a provider batch."""


@dataclass(frozen=True, slots=True)
class Submission:
    key: str
    batch_key: str
    classifier_version: str
    provider_batch_id: str | None
    status: str
    jobs: tuple[tuple[uuid.UUID, int], ...]


def _submission(row: Any) -> Submission:
    return Submission(
        row.key,
        row.batch_key,
        row.classifier_version,
        row.provider_batch_id,
        row.status,
        tuple(zip(row.job_ids, row.attempts, strict=True)),
    )


class BatchLedger(Ledger):
    """The ledger's batch rows, over the job database's engine."""

    def open_submission(
        self, key: str, batch_key: str, classifier_version: str, submitted: Sequence[tuple[uuid.UUID, int]]
    ) -> Submission:
        """The submission named ``key``: written now (``submitting``), or as an earlier try left it."""
        values = {
            "key": key,
            "batch_key": batch_key,
            "classifier_version": classifier_version,
            "job_ids": [job_id for job_id, _ in submitted],
            "attempts": [attempt for _, attempt in submitted],
        }
        with self.engine.begin() as conn:
            conn.execute(pg.insert(model_batches).values(values).on_conflict_do_nothing(index_elements=["key"]))
            return _submission(conn.execute(sa.select(model_batches).where(model_batches.c.key == key)).one())

    def mark_running(self, key: str, provider_batch_id: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(
                sa.update(model_batches)
                .where(model_batches.c.key == key, model_batches.c.status.in_(("submitting", "running")))
                .values(provider_batch_id=provider_batch_id, status="running")
            )

    def open_batches(self, batch_key: str) -> list[Submission]:
        """The run's submissions still running (or never accepted by the provider)."""
        return self._submissions(batch_key, model_batches.c.status.in_(("submitting", "running")))

    def unaccepted(self, batch_key: str) -> list[Submission]:
        """The run's submissions that never got the provider's id and that nobody is submitting:
        none of their jobs is under a live lease. A submission whose jobs are still leased is
        being written by a live try (of this run, or of another run of the same data interval):
        settling it now could mark a batch lost while the provider takes it, paid and never read."""
        live = (
            sa.select(jobs.c.id)
            .where(
                jobs.c.id == sa.any_(model_batches.c.job_ids),
                jobs.c.status == "running",
                jobs.c.lease_expires_at > sa.func.now(),
            )
            .exists()
        )
        return self._submissions(
            batch_key, model_batches.c.status == "submitting", model_batches.c.provider_batch_id.is_(None), ~live
        )

    def _submissions(self, batch_key: str, *where: Any) -> list[Submission]:
        """The run's submissions that match ``where``, oldest first."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(model_batches)
                .where(model_batches.c.batch_key == batch_key, *where)
                .order_by(model_batches.c.submitted_at)
            ).all()
        return [_submission(r) for r in rows]

    def finish(self, key: str, status: str, answers: Iterable[dict[str, Any]], actor: str) -> int:
        """Record the batch's answers (rows of ``model_batch_answers`` without ``batch``), mark it
        ``collected`` or ``lost``, and make its parked jobs due now; how many were made due. One
        transaction: a collector that dies halfway leaves the batch running, to be collected again."""
        rows = [{**answer, "batch": key} for answer in answers]
        with self.transaction(actor) as conn:
            submission = _submission(
                conn.execute(sa.select(model_batches).where(model_batches.c.key == key).with_for_update()).one()
            )
            if submission.status not in ("submitting", "running"):
                return 0
            if rows:
                conn.execute(pg.insert(model_batch_answers).values(rows).on_conflict_do_nothing())
            conn.execute(
                sa.update(model_batches)
                .where(model_batches.c.key == key)
                .values(status=status, finished_at=sa.func.now())
            )
            due = conn.execute(
                sa.update(jobs)
                .where(
                    jobs.c.id.in_([job_id for job_id, _ in submission.jobs]),
                    jobs.c.status == "waiting",
                    jobs.c.status_reason == BATCH_REASON,
                )
                .values(next_attempt_at=sa.func.now())
                .returning(jobs.c.id)
            ).all()
        return len(due)

    def answers(self, claimed: Iterable[tuple[uuid.UUID, int, int]]) -> dict[uuid.UUID, Any]:
        """The batch answer (row) of each claimed job ``(id, attempt, attempt_base)``: the latest
        one asked within its current attempt budget, ``attempt_base < asked <= attempt`` (a failed
        request: none). Not only at the claim's own attempt: a submission adopted after the jobs'
        first lease ran out (that attempt counted, the next one claimed) is answered at the attempt
        it was submitted at, and is not paid for again; a reviewer's requeue starts a new budget,
        so the model is asked afresh."""
        budgets = {job_id: (attempt, base) for job_id, attempt, base in claimed}
        if not budgets:
            return {}
        a = model_batch_answers
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(a).where(a.c.job_id.in_(list(budgets)), a.c.error_class.is_(None)).order_by(a.c.attempt)
            ).all()
        found: dict[uuid.UUID, Any] = {}
        for row in rows:  # by attempt: the latest within the budget wins
            attempt, base = budgets[row.job_id]
            if base < row.attempt <= attempt:
                found[row.job_id] = row
        return found
