"""The step runner: claim a batch, hand it to a step handler, record the outcomes; repeat.

The same loop serves every step (``classify``, ``persist``). It holds each claim under a lease
that a heartbeat thread extends while the handler works, retries jobs that become due within
``retry_soon_seconds`` in the same run, and otherwise stops with :class:`WorkRemains` so that
the caller (an Airflow task) fails and its retry picks them up later; work parked on an outage
and not yet due is first probed with one of its jobs (:mod:`triage.pipeline.probes`). Each claim is owned to the
end (:mod:`triage.pipeline.ownership`): nothing is started once its lease is lost
(:class:`OwnershipLost`), and a drain (SIGTERM) gives back what was not started (:class:`Drained`).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Claim, ClaimedJob, Outcome, Recorded, Release
from triage.jobs.vocabulary.states import Step
from triage.observability import (
    NULL_METRICS,
    Metrics,
    log_job_outcomes,
    observe_batch,
    observe_exhausted,
    observe_states,
)
from triage.pipeline.claim_ahead import Handling, handling_pool
from triage.pipeline.ownership import Drain, Ownership
from triage.pipeline.probes import OutageProbe
from triage.tracing import annotate_current_span, batch_span

log = logging.getLogger(__name__)


class StepError(Exception):
    """A step stopped before its batch was done."""


class WorkRemains(StepError):
    """Retryable jobs remain that are not due in this run; a later run (Airflow's retry) takes them."""


class CircuitOpen(StepError):
    """A dependency is down (an outage): transient failures dominate the recent calls, or the
    payload store is gone. The step parked the batch's unfinished jobs (``waiting``, reason
    ``outage:<dependency>``) for ``delay_seconds``; ``retry_after`` is the model's own hint, if
    it gave one (the classify task's retry policy waits that long)."""

    def __init__(
        self,
        message: str,
        *,
        dependency: str = "model",
        delay_seconds: float = 30.0,
        error_class: str | None = None,
        error: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.dependency, self.delay_seconds, self.retry_after = dependency, delay_seconds, retry_after
        self.error_class, self.error = error_class, error
        self.give_back: dict[uuid.UUID, int] = {}
        """Jobs (id -> attempt) whose attempt failed on this outage in an earlier batch of the try,
        before the circuit opened: the step gives that attempt back as it parks them."""
        self.parked = 0


class DependencyMisconfigured(StepError):
    """The dependency refuses every call (credentials, endpoint): retrying will not help."""


class Drained(StepError):
    """The step was asked to stop (SIGTERM: ``on_kill``): it claimed nothing more, gave back the
    jobs it had not started and recorded or gave back the ones in flight."""


class OwnershipLost(StepError):
    """The claim's lease was lost (it ran out, or another worker holds the jobs now): the jobs
    not yet acted on were left alone, and nothing of the claim was recorded."""


class StepHandler(Protocol):
    step: Step

    @property
    def classifier_version(self) -> str | None:
        """The version a classifying step claims jobs of (each job is labelled only by the
        classifier version it was registered for); None: any version (no classifier runs)."""
        ...

    def handle(self, jobs: Sequence[ClaimedJob], ownership: Ownership | None = None) -> list[Outcome]:
        """One outcome per job; per-job failures are outcomes, never exceptions. Each job's work
        (a model call, an external action) runs through ``ownership.attempt``."""
        ...

    def stop_reason(self) -> StepError | None:
        """Why claiming should stop (a circuit opened), checked after each batch."""
        ...


@dataclass(frozen=True, slots=True)
class RunSettings:
    owner: str
    batch_size: int = 1000
    lease_seconds: float = 300.0
    retry_soon_seconds: float = 30.0
    progress_every_seconds: float = 10.0
    earlier_tries_of: str | None = None
    """The owner prefix of this task instance: leases its earlier (dead) tries hold are taken back."""
    claim_ahead: bool = False
    """Take the next claim once a full one has one round of calls left to start, and handle it at
    once (:mod:`triage.pipeline.claim_ahead`): for a handler with a ``window`` (the classify step
    of the llm classifier, whose calls share one bounded pool), not a CPU-bound one."""


@dataclass
class StepReport:
    step: str
    batch_key: str
    claimed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0
    stopped: str | None = None

    @property
    def rate(self) -> float:
        return self.claimed / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        parts = ", ".join(f"{k}={v}" for k, v in sorted(self.outcomes.items()))
        return (
            f"step={self.step} batch={self.batch_key} claimed={self.claimed} {parts} "
            f"seconds={self.seconds:.2f} rate={self.rate:.0f}/s"
        )


def claim_size(batch_size: int, concurrency: int) -> int:
    """``batch_size`` rounded up to a multiple of ``concurrency``: without the window across
    claims (:mod:`triage.pipeline.claim_ahead`) a claim is handled to its end before the next, so
    a claim of 500 jobs at 32 calls in flight ends with a round of 20 and 12 idle threads; 512
    keeps them all busy."""
    concurrency = max(concurrency, 1)
    return -(-max(batch_size, 1) // concurrency) * concurrency


def _kind(outcome: Outcome) -> str:
    return type(outcome).__name__


def run_step(
    store: JobStore,
    handler: StepHandler,
    *,
    batch_key: str,
    settings: RunSettings,
    metrics: Metrics = NULL_METRICS,
    drain: Drain | None = None,
) -> StepReport:
    """Work through the step's claimable jobs of ``batch_key``.

    Recording batch N (database work) overlaps with handling batch N+1 (Python work): one
    background writer, so outcomes are written in order; with ``settings.claim_ahead`` and a
    handler with a ``window``, batch N+2 is claimed and started as N+1's last round of calls
    starts (:mod:`triage.pipeline.claim_ahead`; each claim heartbeated from the moment it exists).
    Each batch is summarised once into ``metrics`` (see :mod:`triage.observability`), and every
    job that did not simply succeed gets one log line with its ``correlation_id``.

    :raises WorkRemains: retryable jobs are left that are not due soon.
    :raises CircuitOpen: the handler's circuit breaker opened (claimed, unstarted jobs were
        released first).
    :raises Drained: ``drain`` was requested (:mod:`triage.pipeline.ownership`).
    :raises OwnershipLost: a claim's lease was lost before its jobs were all acted on.
    """
    drain = drain or Drain()
    report = StepReport(step=handler.step, batch_key=batch_key)
    annotate_current_span(handler.step, batch_key)  # Airflow's task span, when tracing is on
    if settings.earlier_tries_of is not None:
        rescued = store.release_expired_leases(
            earlier_tries_of=settings.earlier_tries_of, owner=settings.owner, batch_key=batch_key, actor=settings.owner
        )
        if rescued.job_ids:
            log.info(
                "step=%s batch=%s took back %d jobs from expired leases or earlier tries (%d to review)",
                handler.step,
                batch_key,
                rescued.retrying + rescued.to_review,
                rescued.to_review,
            )
    version = handler.classifier_version
    resume = _resumer(store, handler.step, batch_key, settings.owner, version)
    resume()
    probe = OutageProbe(store, handler.step, batch_key, settings.owner, version)
    total = store.open_in_step(batch_key, handler.step, version)
    began = last_progress = time.perf_counter()
    log.info("step=%s batch=%s starting with %d open jobs", handler.step, batch_key, total)
    writer = ThreadPoolExecutor(1, "triage-record")
    pending: Future[Recorded] | None = None
    # The window across claims (triage.pipeline.claim_ahead): the next claim is taken once the
    # current one has this many jobs left to start (0: no window, a claim is handled to its end).
    window = getattr(handler, "window", 0) if settings.claim_ahead else 0
    live: list[Handling] = []  # claims taken and not yet recorded, oldest first

    def take() -> Claim:
        return store.claim(
            batch_key=batch_key,
            step=handler.step,
            limit=1 if probe.pending else settings.batch_size,  # the probe: one call, nothing beside it
            lease_seconds=settings.lease_seconds,
            owner=settings.owner,
            classifier_version=version,
        )

    def settle() -> bool:
        """Wait for the batch being written; True if there was one."""
        nonlocal pending
        if pending is None:
            return False
        recorded, pending = pending.result(), None
        report.outcomes["exhausted"] += recorded.exhausted
        observe_exhausted(metrics, handler.step, recorded.exhausted)
        return True

    def account(claim: Claim, outcomes: list[Outcome], handled: float) -> None:
        report.outcomes.update(_kind(o) for o in outcomes)
        observe_batch(metrics, handler.step, outcomes, handled)
        log_job_outcomes(log, handler.step, claim.jobs, outcomes)

    with handling_pool(2 if window else 0) as pool:

        def begin(claim: Claim, claimed_at: float) -> Handling:
            def span(jobs: Sequence[ClaimedJob]) -> AbstractContextManager[object]:
                return batch_span(handler.step, batch_key, jobs)

            report.claimed += len(claim.jobs)
            return Handling(store, claim, claimed_at, settings.lease_seconds, drain, handler.handle, span, pool)

        try:
            while True:
                if drain.requested:
                    settle()
                    raise Drained(f"step {handler.step} of {batch_key} drained on request after {report.claimed} jobs")
                if not live:
                    claimed_at = time.monotonic()
                    claim = take()
                    if not claim.jobs:
                        if settle():
                            continue  # the batch just written may have released or requeued jobs
                        resumed, parked_due = resume()
                        if resumed:
                            continue
                        due, now = store.next_due(batch_key, handler.step, version)
                        due = min((d for d in (due, parked_due) if d is not None), default=None)
                        if due is None:
                            break
                        wait = (due - now).total_seconds()
                        if wait > settings.retry_soon_seconds:
                            if parked_due is not None and probe.take():
                                continue  # claim the probe: it asks the dependency now
                            raise WorkRemains(
                                f"retryable jobs of {batch_key} at step {handler.step} are due in {wait:.0f}s"
                            )
                        drain.sleep(max(wait, 0.05))
                        continue
                    live.append(begin(claim, claimed_at))
                current = live[0]
                if window and len(live) == 1 and len(current.claim.jobs) >= settings.batch_size:
                    current.near_end(window)  # a full claim: more is likely waiting
                    if not (drain.requested or current.ownership.lost or handler.stop_reason()):
                        claimed_at = time.monotonic()
                        claim = take()
                        if claim.jobs:
                            live.append(begin(claim, claimed_at))
                outcomes, ownership = current.result(), current.ownership
                outcomes = probe.judge(outcomes)
                settle()
                if ownership.draining:
                    raise Drained(
                        f"step {handler.step} of {batch_key} drained on request: {ownership.given_back} jobs "
                        f"given back, {ownership.recorded} recorded"
                    )
                if ownership.lost:
                    live.remove(current)
                    raise OwnershipLost(
                        f"lease {current.claim.token} lost at step {handler.step} of {batch_key}: "
                        f"{sum(isinstance(o, Release) for o in outcomes)} jobs left alone, "
                        "nothing recorded"
                    )
                pending = writer.submit(store.record, current.claim, outcomes)
                live.remove(current)
                account(current.claim, outcomes, current.seconds)
                if time.perf_counter() - last_progress >= settings.progress_every_seconds:
                    last_progress = time.perf_counter()
                    elapsed = last_progress - began
                    log.info(
                        "step=%s batch=%s progress %d/%d rate=%.0f/s outcomes=%s",
                        handler.step,
                        batch_key,
                        report.claimed,
                        total,
                        report.claimed / elapsed,
                        dict(report.outcomes),
                    )
                stop = handler.stop_reason()
                if stop is not None:
                    settle()
                    for ahead in list(live):  # the claim taken ahead: the handler starts none of its jobs now
                        live.remove(ahead)
                        if (finished := ahead.finish()) is not None:
                            account(ahead.claim, finished, ahead.seconds)
                    if isinstance(stop, CircuitOpen):
                        stop.parked = _park_rest(store, handler.step, batch_key, settings.owner, version, stop)
                    raise stop
                if probe.verdict is not None:
                    settle()  # the probe's outcome is written before the rest moves
                    if not probe.conclude():  # still down: the try stops as on an open circuit
                        stop = probe.stop()
                        stop.parked = _park_rest(store, handler.step, batch_key, settings.owner, version, stop)
                        raise stop
            settle()
        except StepError as exc:
            report.stopped = exc.__class__.__name__
            exc.report = report  # type: ignore[attr-defined]
            raise
        finally:
            for handling in live:  # a drain, a lost lease, an error: given back, what finished recorded
                handling.stop_starting()
            for handling in live:
                handling.abandon()
            if pending is not None:  # an error elsewhere: still let the written batch land or fail
                pending.exception()
            writer.shutdown(wait=True)
            report.seconds = time.perf_counter() - began
            log.info("%s", report.summary())
            _observe_end(store, metrics, handler.step, batch_key)
    return report


def _resumer(
    store: JobStore, step: str, batch_key: str, owner: str, version: str | None
) -> Callable[[], tuple[int, datetime | None]]:
    """Queue the batch's jobs parked on an outage once due (a claim of the batch is what takes
    them up again); returns (how many, when the next parked one is due)."""

    def resume() -> tuple[int, datetime | None]:
        resumed, due = store.resume_parked(batch_key, step, actor=owner, classifier_version=version)
        if resumed:
            log.info("step=%s batch=%s queued %d jobs parked on an outage, now due", step, batch_key, resumed)
        return resumed, due

    return resume


def _park_rest(store: JobStore, step: str, batch_key: str, owner: str, version: str | None, stop: CircuitOpen) -> int:
    """Park the batch's unclaimed jobs on the outage too: the task is about to fail, and its
    failure callback must find nothing of the outage to send to review."""
    parked = store.park_unstarted(
        batch_key,
        step,
        dependency=stop.dependency,
        delay_seconds=stop.delay_seconds,
        error_class=stop.error_class,
        error=stop.error,
        actor=owner,
        classifier_version=version,
        give_back=stop.give_back,
        backoff=stop.retry_after is None,
    )
    log.warning(
        "step=%s batch=%s outage:%s: parked the batch's unfinished jobs for %.0fs%s (%d unclaimed); no attempt spent",
        step,
        batch_key,
        stop.dependency,
        stop.delay_seconds,
        "" if stop.retry_after is not None else ", doubled for each earlier outage parking of a job",
        parked,
    )
    return parked


def _observe_end(store: JobStore, metrics: Metrics, step: str, batch_key: str) -> None:
    """The batch's state gauges. Metrics never fail a step: the one broad ``except`` here is
    the degraded path (the database may be the reason the step is ending)."""
    if not metrics.enabled:
        return
    try:
        observe_states(metrics, step, batch_key, store.status_counts(batch_key))
    except Exception as exc:  # noqa: BLE001 - named degraded path: see the docstring
        log.warning("step=%s batch=%s state gauges not sent: %s", step, batch_key, exc.__class__.__name__)
