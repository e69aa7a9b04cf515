"""Ownership of a claim to the end: a worker acts on a job only while it holds the job's lease,
and gives back what it cannot finish when it is told to stop.

- :class:`Ownership` is one claim's record of which jobs were started, finished or given back.
  A handler runs each job through :meth:`Ownership.attempt`: nothing is started (no model call,
  no label action) once the lease is lost, by the heartbeat's word or by the local clock, or
  once a drain was requested. With ``confirm=True`` (the label action) the job's lease is
  extended by a fenced write first, so the action runs only while the ledger says it is ours.
- :class:`Drain` is the request to stop: Airflow's ``on_kill`` (SIGTERM: a Celery shutdown, a
  pod eviction, a task killed from the UI) sets it, from the signal handler, so it only sets a
  flag.
- :class:`Heartbeat` extends the claim's lease while the handler works and, once a drain is
  requested, gives the unstarted jobs back at once (``running -> queued``, the attempt undone),
  lets the jobs in flight finish for ``grace_seconds``, then records what finished and gives
  back the rest. The handler's thread may still be inside a model call when that happens: its
  late result is dropped (the job is no longer ours; the fenced write would refuse it anyway).
"""

from __future__ import annotations

import enum
import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LeaseLost
from triage.jobs.vocabulary.models import Claim, ClaimedJob, Outcome, Release

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05
"""How often the heartbeat thread looks for a drain request (a flag: no I/O)."""


class Drain:
    """A request to stop taking work. :meth:`request` is called from a signal handler: it only
    sets a flag (no lock, no I/O), and every reader polls it.

    :param grace_seconds: how long jobs already in flight may take to finish before they are
        given back. Keep it under Airflow's escalation from SIGTERM to SIGKILL (5 s).
    """

    def __init__(self, grace_seconds: float = 3.0) -> None:
        self.grace_seconds = grace_seconds
        self.requested_at: float | None = None

    def request(self) -> None:
        if self.requested_at is None:
            self.requested_at = time.monotonic()

    @property
    def requested(self) -> bool:
        return self.requested_at is not None

    def sleep(self, seconds: float) -> None:
        """Sleep ``seconds``, waking early when a drain is requested."""
        end = time.monotonic() + seconds
        while not self.requested and (left := end - time.monotonic()) > 0:
            time.sleep(min(left, POLL_SECONDS * 2))


class _State(enum.Enum):
    """What became of a job of the claim; a job not yet entered is unstarted."""

    STARTED = "started"
    FINISHED = "finished"
    GIVEN_BACK = "given_back"


class Ownership:
    """Which jobs of one claim this worker still owns, and what it did with them.

    :param valid_until: ``time.monotonic()`` before the claim was made plus the lease: past it
        the lease may have run out, whatever the heartbeat last heard.
    """

    def __init__(self, store: JobStore, claim: Claim, lease_seconds: float, drain: Drain, valid_until: float) -> None:
        self.store, self.claim, self.lease_seconds, self.drain = store, claim, lease_seconds, drain
        self._lock = threading.Lock()
        # Only the jobs acted on are entered (absent: unstarted), so that a claim costs no
        # per-job work before its first job starts.
        self._states: dict[uuid.UUID, _State] = {}
        self._outcomes: dict[uuid.UUID, Outcome] = {}
        self._valid_until = valid_until
        self.lost_by: BaseException | None = None
        self.draining = False
        self.closed = False
        self.given_back = 0
        self.recorded = 0
        self.near_end = threading.Event()
        """Set once all but :meth:`watch_end`'s number of jobs were started (or the claim ended)."""
        self._near_end_at: int | None = None

    def watch_end(self, jobs_left: int) -> threading.Event:
        """:attr:`near_end`, set from now on once at most ``jobs_left`` jobs are still to start."""
        with self._lock:
            self._near_end_at = max(len(self.claim.jobs) - jobs_left, 0)
            if len(self._states) >= self._near_end_at:
                self.near_end.set()
        return self.near_end

    @property
    def lost(self) -> bool:
        return self.lost_by is not None or time.monotonic() >= self._valid_until

    def lose(self, exc: BaseException) -> None:
        self.lost_by = exc

    def extended(self, since: float) -> None:
        """The heartbeat sent at ``since`` (monotonic) was accepted."""
        self._valid_until = since + self.lease_seconds

    def attempt(self, job: ClaimedJob, act: Callable[[], Outcome], *, confirm: bool = False) -> Outcome:
        """``act()`` for ``job`` if this worker may still start it, else :class:`Release` (the
        job is not acted on; a drain gives it back, a lost lease is the step's error).

        :param confirm: extend the job's lease in the ledger first (a fenced write): for an
            external effect, where the heartbeat's last word is not enough.
        """
        job_id = job.id
        with self._lock:
            # The properties `drain.requested` and `lost`, inline: this runs once per job.
            if (
                self.draining
                or self.closed
                or self.drain.requested_at is not None
                or self.lost_by is not None
                or time.monotonic() >= self._valid_until
            ):
                return Release(job_id, job.attempt)
            self._states[job_id] = _State.STARTED
            if self._near_end_at is not None and len(self._states) >= self._near_end_at:
                self.near_end.set()
        if confirm:
            try:
                self.store.heartbeat(self.claim, self.lease_seconds, [job.id])
            except LeaseLost as exc:
                self.lose(exc)
                with self._lock:
                    del self._states[job_id]
                return Release(job_id, job.attempt)
        outcome = act()
        with self._lock:
            if self._states[job_id] is _State.STARTED:
                self._states[job_id] = _State.FINISHED
                self._outcomes[job_id] = outcome
        return outcome

    def begin_drain(self) -> list[ClaimedJob]:
        """Start draining (unless the handler's thread already took the claim's outcomes): no job
        starts any more; returns the unstarted jobs, now given back."""
        with self._lock:
            if self.closed or self.draining:
                return []
            self.draining = True
            unstarted = [j for j in self.claim.jobs if j.id not in self._states]
            for job in unstarted:
                self._states[job.id] = _State.GIVEN_BACK
        return unstarted

    @property
    def in_flight(self) -> int:
        with self._lock:
            return sum(1 for s in self._states.values() if s is _State.STARTED)

    def settle(self) -> tuple[list[Outcome], list[ClaimedJob]]:
        """End the claim: the outcomes of the finished jobs, and the jobs still in flight,
        abandoned (their late outcomes are dropped)."""
        with self._lock:
            self.closed = True
            finished = [self._outcomes[j.id] for j in self.claim.jobs if self._states.get(j.id) is _State.FINISHED]
            abandoned = [j for j in self.claim.jobs if self._states.get(j.id) is _State.STARTED]
            for job in self.claim.jobs:
                if self._states.get(job.id) in (_State.FINISHED, _State.STARTED):
                    self._states[job.id] = _State.GIVEN_BACK
        return finished, abandoned

    def close(self) -> bool:
        """The handler's thread takes the claim's outcomes; True if a drain took them first."""
        with self._lock:
            drained = self.draining
            self.closed = True
        return drained

    def give_back(self, jobs: Sequence[ClaimedJob], finished: Sequence[Outcome] = ()) -> None:
        """Record ``finished`` and release ``jobs`` (``running -> queued``, the attempt undone) in
        one fenced transaction. The named degraded path: a drain is best effort, so a failure is
        logged and the lease (or the retried task's take-back) returns the jobs instead."""
        outcomes = [*finished, *(Release(j.id, j.attempt) for j in jobs)]
        if not outcomes:
            return
        try:
            self.store.record(self.claim, outcomes)
        except LeaseLost as exc:
            self.lose(exc)
            log.warning(
                "drain: lease %s already lost; %d jobs return when it runs out", self.claim.token, len(outcomes)
            )
            return
        except Exception as exc:  # noqa: BLE001 - named degraded path: see the docstring
            log.warning(
                "drain: lease %s not given back (%s); %d jobs return when it runs out",
                self.claim.token,
                exc.__class__.__name__,
                len(outcomes),
            )
            return
        self.given_back += len(jobs)
        self.recorded += len(finished)

    def drain_now(self, grace_seconds: float) -> None:
        """Give back the unstarted jobs at once, wait up to ``grace_seconds`` for those in
        flight, then record what finished and give back the rest."""
        unstarted = self.begin_drain()
        if not self.draining:
            return
        self.give_back(unstarted)
        if unstarted:
            log.info("drain: gave back %d unstarted jobs of lease %s", len(unstarted), self.claim.token)
        deadline = time.monotonic() + grace_seconds
        while self.in_flight and time.monotonic() < deadline:
            time.sleep(POLL_SECONDS)
        finished, abandoned = self.settle()
        self.give_back(abandoned, finished)
        log.info(
            "drain: lease %s settled: %d finished recorded, %d in flight given back",
            self.claim.token,
            len(finished),
            len(abandoned),
        )


class Heartbeat:
    """Extends a claim's lease every third of its length until stopped; drains the claim when a
    drain is requested (:meth:`Ownership.drain_now`, on this thread, so that the unstarted jobs
    go back while the handler's thread is still busy)."""

    def __init__(self, ownership: Ownership) -> None:
        self.ownership = ownership
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="triage-heartbeat", daemon=True)

    @property
    def lost(self) -> BaseException | None:
        return self.ownership.lost_by

    def _run(self) -> None:
        own = self.ownership
        interval = own.lease_seconds / 3
        next_beat = time.monotonic() + interval
        while not self._stop.wait(POLL_SECONDS):
            if own.drain.requested:
                assert own.drain.requested_at is not None
                own.drain_now(max(own.drain.requested_at + own.drain.grace_seconds - time.monotonic(), 0.0))
                return
            if time.monotonic() < next_beat:
                continue
            since, next_beat = time.monotonic(), time.monotonic() + interval
            try:
                own.store.heartbeat(own.claim, own.lease_seconds)
                own.extended(since)
            except LeaseLost as exc:  # nothing more is started; the write of the outcomes would be refused
                own.lose(exc)
                return
            except Exception as exc:  # noqa: BLE001 - a heartbeat never kills the work; the lease may hold
                log.warning("heartbeat failed for lease %s: %s", own.claim.token, exc.__class__.__name__)

    def __enter__(self) -> Heartbeat:
        if self._thread.ident is None:  # a claim taken ahead is entered once more to be handled
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stop extending the lease without closing the claim (its holder gives it back); a
        drain the thread already began is let finish."""
        self._stop.set()
        self._thread.join()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        own = self.ownership
        if exc_type is not None:
            # The handler was interrupted (execution_timeout, a bug): what finished is recorded,
            # the rest is given back now rather than when the lease runs out.
            own.drain.request()
        if not own.drain.requested and not own.close():
            self._stop.set()  # closed first: from here on the thread cannot begin a drain
            self._thread.join()
            return
        self._thread.join()  # it drains the claim (or has, or lost the lease) before it ends
        if not own.closed:
            own.drain_now(0.0)
