"""One claim being handled (:class:`Handling`), and the window of model calls across claims that
``RunSettings.claim_ahead`` opens.

Without the window the step runner handles a claim to its end before it takes the next: each
claim ends in a round of calls finishing one by one with nothing to replace them, then the next
claim's round trip and payload read with no call running at all, 0.3-0.5 s a boundary at 32
calls of 200 ms in flight (docs/performance.md). With it, once the current claim has one round
of calls left to start (the handler's :attr:`window`, its concurrency), the next claim is taken
and handed to the handler at once, on a thread of its own: its calls queue behind the current
claim's on the handler's one bounded pool, so each thread that ends a call of the last round
starts one of the next claim. Nothing is claimed earlier than one round before it is needed, so
a second worker started meanwhile still finds the rest of the day (a claim taken at the start of
the previous one, as tried in session 8, held a second full claim from the outset).

A claim is owned from the moment it exists: its :class:`~triage.pipeline.ownership.Ownership`
and :class:`~triage.pipeline.ownership.Heartbeat` start as it is taken, so its lease is extended
while its jobs wait in the pool and a drain (SIGTERM) gives back what it has not started. When
the step stops on the claim before it for anything but the handler's own stop (an open circuit,
a refusing model: :meth:`Handling.finish` lets it end and records it), :meth:`Handling.abandon`
gives back its unstarted jobs at once and records what it finished: nothing is left leased until
the lease runs out.
"""

from __future__ import annotations

import contextlib
import contextvars
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Claim, ClaimedJob, Outcome
from triage.pipeline.ownership import Drain, Heartbeat, Ownership

__all__ = ["Handling"]

Handle = Callable[[Sequence[ClaimedJob], Ownership], list[Outcome]]
Span = Callable[[Sequence[ClaimedJob]], contextlib.AbstractContextManager[Any]]


class Handling:
    """``handle(claim.jobs, ownership)`` under the claim's heartbeat and ``span``: on the caller's
    thread (``pool`` None: done when the constructor returns, its error raised there) or on
    ``pool``, in a copy of the caller's context (the task's span, bound log fields)."""

    def __init__(
        self,
        store: JobStore,
        claim: Claim,
        claimed_at: float,
        lease_seconds: float,
        drain: Drain,
        handle: Handle,
        span: Span,
        pool: ThreadPoolExecutor | None = None,
    ) -> None:
        self.claim, self.store = claim, store
        self.ownership = Ownership(store, claim, lease_seconds, drain, claimed_at + lease_seconds)
        self.heartbeat = Heartbeat(self.ownership).__enter__()  # the lease is extended from now on
        self.seconds = 0.0
        self.outcomes: Future[list[Outcome]]
        if pool is None:
            self.outcomes = Future()
            self.outcomes.set_result(self._run(handle, span))
        else:
            self.outcomes = pool.submit(contextvars.copy_context().run, self._run, handle, span)

    def _run(self, handle: Handle, span: Span) -> list[Outcome]:
        began = time.perf_counter()
        try:
            with self.heartbeat, span(self.claim.jobs):
                return handle(self.claim.jobs, self.ownership)
        finally:
            self.seconds = time.perf_counter() - began
            self.ownership.near_end.set()  # a handler may end without starting every job

    def near_end(self, jobs_left: int) -> None:
        """Wait until at most ``jobs_left`` of the claim's jobs are still to start."""
        self.ownership.watch_end(jobs_left).wait()

    def result(self) -> list[Outcome]:
        """The claim's outcomes, once handled; the handler's error, if it raised."""
        return self.outcomes.result()

    def finish(self) -> list[Outcome] | None:
        """The step stopped on the handler's word (an open circuit, a refusing model) after the
        claim before this one: the handler starts none of this claim's jobs any more (it parks or
        releases them), so let it end and record its outcomes, fenced. None: a drain or a lost
        lease took them."""
        outcomes = self.result()
        if self.ownership.draining or self.ownership.lost:
            return None
        self.store.record(self.claim, outcomes)
        return outcomes

    def stop_starting(self) -> None:
        """The first half of :meth:`abandon`, for every claim of the window before either waits:
        no job of this claim starts any more, and those not started go back at once."""
        self.heartbeat.stop()  # a drain the heartbeat already began is let finish
        if not self.outcomes.done():
            self.ownership.give_back(self.ownership.begin_drain())

    def abandon(self) -> None:
        """The step ends on an error, a drain or a lost lease of another claim: give back the
        jobs not started at once, let those in flight finish for the drain's grace, record what
        finished and give back the rest (the drain of this claim alone)."""
        self.stop_starting()
        if not self.outcomes.done():
            self.ownership.drain_now(self.ownership.drain.grace_seconds)
        if self.ownership.draining or self.ownership.lost:
            return  # the drain recorded what finished and gave back the rest (or the lease is gone)
        if self.outcomes.exception() is None:  # handled to its end first, never recorded
            self.ownership.give_back([], self.outcomes.result())


@contextlib.contextmanager
def handling_pool(size: int) -> Iterator[ThreadPoolExecutor | None]:
    """The threads claims are handled on in a window (``size`` 0: none, handled inline). Not
    waited for at the end: a claim abandoned on an error may still be inside a model call, whose
    late outcome is dropped (its ownership is closed)."""
    if size <= 0:
        yield None
        return
    pool = ThreadPoolExecutor(size, "triage-handle")
    try:
        yield pool
    finally:
        pool.shutdown(wait=False)
