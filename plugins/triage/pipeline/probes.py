"""The half-open probe of an outage, as the step runner (:func:`triage.pipeline.steps.run_step`)
uses it: once a dependency that parked a batch's work answers again, the work is retried at
once instead of after its whole park delay (the ledger's half: :mod:`triage.jobs.store.probes`).

A circuit breaker has three states: closed (calls go through), open (none do: the work is
parked, :mod:`triage.pipeline.breaker`), and half-open, where one call tries the dependency and
its answer decides. Here the open state is the ledger's (``waiting``, ``outage:<dependency>``,
due at ``next_attempt_at``), so it outlives any one worker, and the half-open call is a parked
job claimed alone by the first run that finds nothing else to do; one prober at a time, the
ledger decides which.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Outcome, Park, Release, RetryLater

if TYPE_CHECKING:
    from triage.pipeline.steps import CircuitOpen

log = logging.getLogger(__name__)


PROBE_PARK_SECONDS = 30.0
"""A failed probe's job is parked again this long (the classify step's default outage wait), grown
with its earlier parkings (:func:`~triage.jobs.sql.moves.outages.outage_due`), unless the dependency said
how long (``Retry-After``)."""


class OutageProbe:
    """The half-open probe of one run of a step (:mod:`triage.jobs.store.probes`).

    When the step finds nothing to claim but work of its batch parked on an outage that is not
    yet due, it takes one parked job out (:meth:`take`, at most once a run, and only if no other
    worker is probing or working on the batch), claims it alone and lets the handler make its
    call. :meth:`judge` reads the probe job's outcome: answered (any outcome but a transient
    failure, a release or a parking), the dependency is back and :meth:`conclude` queues the
    batch's jobs parked on it at once, so that the run goes on with them instead of failing its
    try until their park delay is over; failed again, the probe job is parked again (its attempt
    given back: it was the dependency's failure) and the step stops as on an open circuit
    (:class:`~triage.pipeline.steps.CircuitOpen`), the rest keeping their due time."""

    def __init__(self, store: JobStore, step: str, batch_key: str, owner: str, version: str | None) -> None:
        self.store, self.step, self.batch_key, self.owner, self.version = store, step, batch_key, owner, version
        self.job_id: uuid.UUID | None = None
        self.dependency = ""
        self.tried = False
        self.verdict: bool | None = None  # True: answered, False: failed again, None: not judged
        self.retry_after: float | None = None  # the dependency's Retry-After on the failed probe
        self.error: tuple[str | None, str | None] = (None, None)  # its error class and message
        self.retried: dict[uuid.UUID, int] = {}  # RetryLater handed out by this try: id -> attempt

    @property
    def pending(self) -> bool:
        """A probe was taken and its outcome is not known yet."""
        return self.job_id is not None and self.verdict is None

    def take(self) -> bool:
        """Take one parked job out as the probe (at most once a run); whether one was taken."""
        if self.tried:
            return False
        self.tried = True
        taken = self.store.probes.probe_parked(
            self.batch_key, self.step, actor=self.owner, classifier_version=self.version
        )
        if taken is None:
            return False
        self.job_id, self.dependency = taken
        log.info(
            "step=%s batch=%s outage:%s: probing with one parked job before the park delay is over",
            self.step,
            self.batch_key,
            self.dependency,
        )
        return True

    def judge(self, outcomes: list[Outcome]) -> list[Outcome]:
        """The claim's outcomes as the step records them: the probe job's failure becomes a
        parking again (a transient failure of a dependency that was down is not the job's). A
        claim without the probe job (another worker took it) ends the probe undecided."""
        if not self.pending:
            # Before the probe: the try's transient failures, given back if the probe fails.
            self.retried.update((o.job_id, o.attempt) for o in outcomes if isinstance(o, RetryLater))
            return outcomes
        if all(outcome.job_id != self.job_id for outcome in outcomes):
            self.job_id = None
            return outcomes
        judged = []
        for outcome in outcomes:
            if outcome.job_id == self.job_id:
                self.verdict = not isinstance(outcome, RetryLater | Release | Park)
                if isinstance(outcome, RetryLater):
                    self.retry_after, self.error = outcome.delay_seconds, (outcome.error_class, outcome.error)
                    outcome = Park(
                        outcome.job_id,
                        outcome.attempt,
                        self.dependency,
                        outcome.delay_seconds or PROBE_PARK_SECONDS,
                        outcome.error_class,
                        outcome.error,
                        backoff=outcome.delay_seconds is None,
                    )
            judged.append(outcome)
        return judged

    def conclude(self) -> bool:
        """After the probe's outcome is written: if it was answered, queue the parked work at
        once and return True; False if it failed again (the step stops)."""
        answered, self.verdict, self.job_id = bool(self.verdict), None, None
        if not answered:
            return False
        resumed = self.store.probes.resume_after_probe(
            self.batch_key, self.step, dependency=self.dependency, actor=self.owner, classifier_version=self.version
        )
        log.info(
            "step=%s batch=%s outage:%s answered the probe: queued %d parked jobs at once",
            self.step,
            self.batch_key,
            self.dependency,
            resumed,
        )
        return True

    @property
    def failed_again(self) -> str:
        """What the step says when it stops on a failed probe."""
        return f"the probe of the work parked on outage:{self.dependency} failed again; the rest stays parked until due"

    def stop(self) -> CircuitOpen:
        """The :class:`~triage.pipeline.steps.CircuitOpen` a failed probe stops the step with: its
        dependency, the probe job's park delay, the error and the dependency's ``Retry-After``,
        and, to give back as the step parks the rest (as on any open circuit), the attempts of
        this try that failed transiently before the probe: the dependency was down for them too
        (a job the try claimed again after its prober died would otherwise spend its attempts,
        one a try, on the outage while the parked ones spend none)."""
        from triage.pipeline.steps import CircuitOpen  # steps imports this module

        error_class, error = self.error
        stop = CircuitOpen(
            self.failed_again,
            dependency=self.dependency,
            delay_seconds=self.retry_after or PROBE_PARK_SECONDS,
            error_class=error_class,
            error=error,
            retry_after=self.retry_after,
        )
        stop.give_back = dict(self.retried)
        return stop
