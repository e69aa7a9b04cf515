"""The persist step: write the label, complete the job and append its event, in one transaction.

An external action (a webhook, a ticket) runs here, before the outcome is recorded, and carries
the job's idempotency key so that the provider refuses a duplicate when a retry repeats it, and
the label's order (:mod:`triage.pipeline.actions`). A job whose document already has a newer
job's label completes without its action: the older label must not reach the provider after
the newer one (the ledger keeps the newer either way).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence

from triage.jobs.label_actions import superseded
from triage.jobs.models import ClaimedJob, Complete, Fail, LabelWrite, Outcome, RetryLater
from triage.jobs.states import Step
from triage.jobs.store import JobStore
from triage.observability import log_job
from triage.pipeline.ownership import Ownership
from triage.pipeline.steps import StepError

ExternalAction = Callable[[ClaimedJob, LabelWrite], None]

log = logging.getLogger(__name__)


class PersistHandler:
    """:class:`~triage.pipeline.steps.StepHandler` of the ``persist`` step."""

    step = Step.PERSIST
    classifier_version = None  # runs no classifier: the label is the classification already recorded

    def __init__(self, store: JobStore, action: ExternalAction | None = None) -> None:
        self.store, self.action = store, action

    def handle(self, jobs: Sequence[ClaimedJob], ownership: Ownership | None = None) -> list[Outcome]:
        labels = self.store.accepted_labels([j.id for j in jobs])
        stale: set[uuid.UUID] = set()
        if self.action is not None:
            with self.store.engine.connect() as conn:
                stale = superseded(conn, [j.id for j in jobs if j.id in labels])
        outcomes: list[Outcome] = []
        for job in jobs:
            label = labels.get(job.id)
            if label is None:  # advanced without an accepted classification: never guess one
                outcomes.append(
                    Fail(
                        job.id,
                        job.attempt,
                        "missing_classification",
                        "missing_classification",
                        "no accepted classification recorded for this job",
                    )
                )
                continue
            if job.id in stale:
                log_job(log, logging.INFO, job, "label action skipped: a newer job's label stands for its document")
            elif self.action is not None:
                if ownership is None:
                    outcomes.append(self._act(job, label))
                else:  # the lease is confirmed in the ledger right before the effect
                    outcomes.append(ownership.attempt(job, functools.partial(self._act, job, label), confirm=True))
                continue
            outcomes.append(Complete(job.id, job.attempt, label))
        return outcomes

    def _act(self, job: ClaimedJob, label: LabelWrite) -> Outcome:
        assert self.action is not None
        try:
            self.action(job, label)
        except Exception as exc:  # noqa: BLE001 - a failed action is retried, bounded, never a stuck batch
            return RetryLater(job.id, job.attempt, "external_action_failed", type(exc).__name__)
        return Complete(job.id, job.attempt, label)

    def stop_reason(self) -> StepError | None:
        return None
