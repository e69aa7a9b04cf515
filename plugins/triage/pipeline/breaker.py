"""The classify step's circuit breaker: when transient failures dominate the recent calls, the
dependency is down (an outage), not the jobs (:mod:`triage.pipeline.classify` parks them).

Two rules open it. The window rule judges a large try: at least ``threshold`` of the last
``window`` calls, and ``min_calls`` of them, failed transiently. A try of fewer jobs never makes
``min_calls`` calls before every job's attempts are spent, so the all-down rule judges it: every
call so far failed with a dependency-class error (:data:`DEPENDENCY_DOWN`: 5xx, timeout,
connection refused; never a 4xx, a 429 or a bad answer) and those failures span
:meth:`CircuitBreaker.jobs_needed` distinct jobs that had not failed before. One job is never
enough: from inside the step a model that is down and a document whose call always times out
look the same, and parking the latter would park it forever; it spends its attempts instead and
ends in review.

:class:`OutageGuard` keeps, beside a handler's breaker, the outcomes of one try that the outage
caused before the circuit opened, so that the jobs get those attempts back."""

from __future__ import annotations

import threading
import uuid
from collections import deque
from collections.abc import Callable, Hashable, Iterable

from triage.jobs.vocabulary.models import Outcome, Park, Release, RetryLater

__all__ = ["DEPENDENCY_DOWN", "CircuitBreaker", "OutageGuard"]

DEPENDENCY_DOWN = frozenset({"server_error", "timeout", "connection_error"})
"""The error classes of a model call that say the dependency is down, not that the document or
the request is wrong."""


class CircuitBreaker:
    """Opens by the window rule or the all-down rule (see the module docstring). Thread-safe;
    once open it stays open for this run.

    :param min_jobs: how many distinct jobs the all-down rule wants at most (fewer if fewer
        were claimed, never fewer than 2)."""

    def __init__(self, window: int = 50, threshold: float = 0.5, min_calls: int = 20, min_jobs: int = 3) -> None:
        self._calls: deque[bool] = deque(maxlen=window)
        self._failed = 0  # the transient failures among _calls (summing the window at every call cost ~0.4 µs)
        self._threshold, self._min_calls, self._min_jobs = threshold, min_calls, min_jobs
        self._claimed: set[Hashable] = set()
        self._down_jobs: set[Hashable] = set()
        self._all_down = True  # every call so far failed with a dependency-class error
        self._lock = threading.Lock()
        self.is_open = False

    def claimed(self, job_ids: Iterable[Hashable]) -> None:
        """The step was handed these jobs (each counted once, however often it is retried)."""
        with self._lock:
            self._claimed.update(job_ids)

    def jobs_needed(self) -> int:
        """Distinct jobs the all-down rule wants: ``min(min_calls, min_jobs, jobs claimed)``
        (``min_jobs`` while none is known to be claimed), at least 2."""
        return max(2, min(self._min_calls, self._min_jobs, len(self._claimed) or self._min_jobs))

    def record(self, transient_failure: bool, *, dependency_down: bool = False, job: Hashable | None = None) -> None:
        """One call. ``dependency_down``: it failed with a :data:`DEPENDENCY_DOWN` error (any
        other call ends the all-down rule for the run); ``job``: the job that call counts as
        evidence for (None: a job that had failed before, which proves nothing)."""
        with self._lock:
            if self._calls and len(self._calls) == self._calls.maxlen:
                self._failed -= self._calls[0]  # the call the append drops out of the window
            self._calls.append(transient_failure)
            self._failed += transient_failure
            if len(self._calls) >= self._min_calls and self._failed / len(self._calls) >= self._threshold:
                self.is_open = True
            if not dependency_down:
                self._all_down = False
            elif job is not None:
                self._down_jobs.add(job)
            if self._all_down and len(self._down_jobs) >= self.jobs_needed():
                self.is_open = True


class OutageGuard:
    """What a step handler with a breaker keeps of one try's outcomes, so that an outage costs
    the jobs no attempt: the transient failures handed out before the circuit opened were the
    outage's, not the jobs'. Used by the classify and persist steps."""

    def __init__(self) -> None:
        self._retried: dict[uuid.UUID, int] = {}  # RetryLater handed out by this try: id -> attempt

    def settle(self, outcomes: list[Outcome], is_open: bool, park: Callable[[uuid.UUID, int], Park]) -> list[Outcome]:
        """A batch's outcomes as the step records them. ``is_open``: the circuit is open now,
        after the batch; ``park``: the handler's parking of one job (id, attempt)."""
        if not is_open:
            self._retried.update((o.job_id, o.attempt) for o in outcomes if isinstance(o, RetryLater))
            return outcomes
        # The circuit opened during this batch: its failed calls were the outage's, not the jobs'.
        return [park(o.job_id, o.attempt) if isinstance(o, RetryLater | Release) else o for o in outcomes]

    def give_back(self) -> dict[uuid.UUID, int]:
        """The attempts of this try's earlier batches that failed on the outage before it was
        recognised (:attr:`~triage.pipeline.steps.CircuitOpen.give_back`): the step gives them
        back as it parks the jobs."""
        return dict(self._retried)
