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

This is the store's batch part (``JobStore.batches``): it runs the statements of
:mod:`triage.jobs.sql.writes.batches` and the jobs' move
:func:`~triage.jobs.sql.moves.outages.make_batch_due`. Nothing here calls the provider or decides
which answer a job takes: :mod:`triage.pipeline.batch_mode` does (the bookkeeping of batch mode).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from triage.jobs.sql.moves.outages import make_batch_due
from triage.jobs.sql.writes import batches as B
from triage.jobs.store.ledger import Part

__all__ = ["BatchLedger", "Submission"]


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


class BatchLedger(Part):
    """The ledger's batch rows: the store's part ``JobStore.batches``."""

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
        with self.transaction(None) as conn:
            conn.execute(B.open_submission(), values)
            return _submission(conn.execute(B.submission(), {"p_key": key}).one())

    def mark_running(self, key: str, provider_batch_id: str) -> None:
        with self.transaction(None) as conn:
            conn.execute(B.mark_running(), {"p_key": key, "p_provider_batch_id": provider_batch_id})

    def open_batches(self, batch_key: str) -> list[Submission]:
        """The run's submissions still running (or never accepted by the provider)."""
        return self._submissions(B.open_submissions(), batch_key)

    def unaccepted(self, batch_key: str) -> list[Submission]:
        """The run's submissions that never got the provider's id and that nobody is submitting:
        none of their jobs is under a live lease. A submission whose jobs are still leased is
        being written by a live try (of this run, or of another run of the same data interval):
        settling it now could mark a batch lost while the provider takes it, paid and never read."""
        return self._submissions(B.unaccepted_submissions(), batch_key)

    def _submissions(self, statement: Any, batch_key: str) -> list[Submission]:
        with self.engine.connect() as conn:
            rows = conn.execute(statement, {"p_batch_key": batch_key}).all()
        return [_submission(r) for r in rows]

    def finish(self, key: str, status: str, answers: Iterable[dict[str, Any]], actor: str) -> int:
        """Record the batch's answers (rows of ``model_batch_answers`` without ``batch``), mark it
        ``collected`` or ``lost``, and make its parked jobs due now; how many were made due. One
        transaction: a collector that dies halfway leaves the batch running, to be collected again."""
        rows = [{**answer, "batch": key} for answer in answers]
        with self.transaction(actor) as conn:
            submission = _submission(conn.execute(B.submission(lock=True), {"p_key": key}).one())
            if submission.status not in B.OPEN:
                return 0
            if rows:
                conn.execute(B.record_answers(), rows)
            conn.execute(B.finish_submission(), {"p_key": key, "p_status": status})
            due = conn.execute(make_batch_due(), {"ids": [job_id for job_id, _ in submission.jobs]}).all()
        return len(due)

    def answers(self, job_ids: Iterable[uuid.UUID]) -> list[Any]:
        """The answers recorded for the jobs (a failed request's aside), by attempt; which one a
        job takes is batch mode's choice (:func:`triage.pipeline.batch_mode.given_answers`)."""
        ids = list(job_ids)
        if not ids:
            return []
        with self.engine.connect() as conn:
            return list(conn.execute(B.batch_answers(), {"ids": ids}).all())
