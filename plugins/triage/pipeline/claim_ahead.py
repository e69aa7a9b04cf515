"""The next claim, taken while the current one is handled (:class:`ClaimAhead`).

The step runner handles a claim to its end before the next (its outcomes are recorded
together), and the next claim is a round trip that writes a lease and a transition per job. At
32 model calls in flight that round trip is wall time in which no call runs: 0.1-0.9 s per claim
on a loaded machine, most of the llm path's distance from its ideal after the calls themselves
(docs/performance.md). Taking the next claim on a thread of its own while the current one's calls
run keeps it off that path.

A claim taken ahead is owned from the moment it exists, as any claim: its own
:class:`~triage.pipeline.ownership.Ownership` and :class:`~triage.pipeline.ownership.Heartbeat`
start on the claiming thread, so its lease is extended while it waits and a drain (SIGTERM) gives
its jobs back at once. When the step stops for any other reason (an open circuit, a lost lease,
an error) :meth:`ClaimAhead.cancel` gives its jobs back (``running -> queued``, the attempt
undone): nothing is left leased until the lease runs out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from triage.jobs.models import Claim
from triage.jobs.store import JobStore
from triage.pipeline.ownership import Drain, Heartbeat, Ownership

__all__ = ["ClaimAhead", "Held"]


@dataclass
class Held:
    """A claim and its owner; ``heartbeat`` runs from the moment the claim was taken (None: an
    empty claim, nothing to hold)."""

    claim: Claim
    claimed_at: float
    ownership: Ownership | None = None
    heartbeat: Heartbeat | None = None

    def release(self) -> None:
        """Stop the heartbeat and give every job back (none was started); a drain that already
        gave them back leaves nothing to do."""
        if self.heartbeat is None or self.ownership is None:
            return
        self.heartbeat.stop()
        self.ownership.drain_now(0.0)


class ClaimAhead:
    """At most one claim taken ahead, on a thread of its own.

    :param take: takes a claim (the step's ``store.claim`` with its arguments).
    """

    def __init__(self, store: JobStore, take: Callable[[], Claim], lease_seconds: float, drain: Drain) -> None:
        self.store, self._take, self.lease_seconds, self.drain = store, take, lease_seconds, drain
        self._thread = ThreadPoolExecutor(1, "triage-claim-ahead")
        self._next: Future[Held] | None = None

    def start(self, after: Future[Any] | None = None) -> None:
        """Take the next claim once ``after`` (the previous claim's recording) is done: one
        database write at a time beside the handler's start, as without a claim ahead."""
        if self._next is None and not self.drain.requested:
            self._next = self._thread.submit(self._claim, after)

    def _claim(self, after: Future[Any] | None) -> Held:
        if after is not None:
            after.exception()  # its error, if any, is the step's to raise (when it settles)
        claimed_at = time.monotonic()
        claim = self._take()
        if not claim.jobs:
            return Held(claim, claimed_at)
        ownership = Ownership(self.store, claim, self.lease_seconds, self.drain, claimed_at + self.lease_seconds)
        heartbeat = Heartbeat(ownership).__enter__()
        return Held(claim, claimed_at, ownership, heartbeat)

    def take(self) -> Held | None:
        """The claim taken ahead (its heartbeat running), or None if none was started; the
        claim's own error, if it failed."""
        future, self._next = self._next, None
        return None if future is None else future.result()

    def cancel(self) -> None:
        """Give back the claim taken ahead, if any (waiting for it to be taken first). A claim
        that failed holds nothing (its transaction rolled back): the step's own error is the one
        that counts."""
        future, self._next = self._next, None
        if future is None or future.exception() is not None:
            return
        future.result().release()

    def close(self) -> None:
        try:
            self.cancel()
        finally:
            self._thread.shutdown(wait=True)
