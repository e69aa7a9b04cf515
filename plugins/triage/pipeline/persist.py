"""The persist step: write the label, complete the job and append its event, in one transaction.

An external action (a webhook, a ticket) runs here, before the outcome is recorded, and carries
the job's idempotency key so that the provider refuses a duplicate when a retry repeats it, and
the label's order (:mod:`triage.ports.label_actions`). A job whose document already has a newer
job's label completes without its action: the older label must not reach the provider after
the newer one (the ledger keeps the newer either way).

A provider that is down (refused connections, timeouts, 5xx for every call: the same circuit
breaker as the classify step's, :mod:`triage.pipeline.breaker`) is an outage, not the jobs'
failure: the step parks them (``waiting``, ``outage:label_provider``) with their attempts given
back and stops with :class:`~triage.pipeline.steps.CircuitOpen`, so the failure callback sends
nothing of it to review, and the next try, run of the date or ``reconcile_jobs``' resume
finishes them once the provider is back (issue #13, item 3).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import Callable, Sequence

from triage.jobs.sql.audit_samples import is_audit_sample
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClaimedJob, Complete, Fail, LabelWrite, Outcome, Park, RetryLater
from triage.jobs.vocabulary.states import Step
from triage.observability import log_job
from triage.pipeline.breaker import DEPENDENCY_DOWN, CircuitBreaker, OutageGuard
from triage.pipeline.ownership import Ownership
from triage.pipeline.steps import CircuitOpen, StepError
from triage.ports.label_actions import ActionFailed

ExternalAction = Callable[[ClaimedJob, LabelWrite], None]

log = logging.getLogger(__name__)

DEPENDENCY = "label_provider"
OUTAGE_SECONDS = 30.0
"""How long jobs stay parked when the provider is down (doubled for each earlier outage parking
of a job, up to an hour: :func:`triage.jobs.sql.moves.outages.outage_due`): about the persist task's first
Airflow retry delay, so its retry finds them due."""
BREAKER_MIN_JOBS = 5
"""Distinct jobs whose first attempt's action failed with the provider down, and nothing
else in between, before the step calls it an outage: more than the classify step's 3, since a
provider that answers one request late (its effect applied: the timeout-after-success case) is
not down."""


class PersistHandler:
    """:class:`~triage.pipeline.steps.StepHandler` of the ``persist`` step."""

    step = Step.PERSIST
    classifier_version = None  # runs no classifier: the label is the classification already recorded

    def __init__(
        self,
        store: JobStore,
        action: ExternalAction | None = None,
        breaker: CircuitBreaker | None = None,
        *,
        audit_rate: float = 0.0,
    ) -> None:
        """:param audit_rate: share of the jobs completed as audit samples (the run's ``audit_rate``)."""
        self.store, self.action, self.audit_rate = store, action, audit_rate
        self.breaker = breaker or CircuitBreaker(min_jobs=BREAKER_MIN_JOBS)
        self._last_failure: tuple[str, str] | None = None  # (error_class, error) of the latest
        self._outages = OutageGuard()

    def handle(self, jobs: Sequence[ClaimedJob], ownership: Ownership | None = None) -> list[Outcome]:
        if self.breaker.is_open:
            return [self._park(job.id, job.attempt) for job in jobs]
        self.breaker.claimed(job.id for job in jobs)
        outcomes = self._outcomes(jobs, ownership)
        # The provider may have gone down during this batch: its failed actions were the outage's.
        return self._outages.settle(outcomes, self.breaker.is_open, self._park)

    def _outcomes(self, jobs: Sequence[ClaimedJob], ownership: Ownership | None) -> list[Outcome]:
        labels = self.store.accepted_labels([j.id for j in jobs])
        stale: set[uuid.UUID] = set()
        if self.action is not None:
            stale = self.store.superseded([j.id for j in jobs if j.id in labels])
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
            outcomes.append(self._complete(job, label))
        return outcomes

    def _complete(self, job: ClaimedJob, label: LabelWrite) -> Complete:
        return Complete(job.id, job.attempt, label, audit=is_audit_sample(job.id, self.audit_rate))

    def _act(self, job: ClaimedJob, label: LabelWrite) -> Outcome:
        assert self.action is not None
        if self.breaker.is_open:  # no more calls to a provider that is down
            return self._park(job.id, job.attempt)
        try:
            self.action(job, label)
        except ActionFailed as exc:  # the provider answered no, or nothing answered
            down = exc.error_class in DEPENDENCY_DOWN  # a job that failed before proves nothing
            self.breaker.record(True, dependency_down=down, job=job.id if job.attempt_in_budget == 1 else None)
            self._last_failure = (exc.error_class, str(exc))
            return RetryLater(job.id, job.attempt, "external_action_failed", exc.error_class)
        except Exception as exc:  # noqa: BLE001 - a failed action is retried, bounded, never a stuck batch
            self.breaker.record(True)
            return RetryLater(job.id, job.attempt, "external_action_failed", type(exc).__name__)
        self.breaker.record(False)
        return self._complete(job, label)

    def _park(self, job_id: uuid.UUID, attempt: int) -> Park:
        error_class, error = self._last_failure or (None, None)
        return Park(job_id, attempt, DEPENDENCY, OUTAGE_SECONDS, error_class, error, backoff=True)

    def stop_reason(self) -> StepError | None:
        if not self.breaker.is_open:
            return None
        error_class, error = self._last_failure or (None, None)
        stop = CircuitOpen(
            "the label provider is down: its actions fail with no answer or a server error",
            dependency=DEPENDENCY,
            delay_seconds=OUTAGE_SECONDS,
            error_class=error_class,
            error=error,
        )
        stop.give_back = self._outages.give_back()
        return stop
