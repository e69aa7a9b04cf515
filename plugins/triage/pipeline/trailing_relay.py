"""The relay that trails a step: publish the events its commits make relayable while it works.

``publish_events`` relays a run's outbox after ``persist``: in a 100,000-document keyword run its
200,000 events were a fifth of the run, a tail in which nothing else ran. A
:class:`TrailingRelay` runs the same relay (:meth:`triage.jobs.store.JobStore.relay`: claims in
``(txid, event_id)`` order, the watermark, at least once) on a thread of the ``classify`` task
itself, round after round while the task classifies, so ``publish_events`` only sends what is
left. It holds no executor slot and starts no task (``stream_events``, a task relaying beside
``classify``, held one and was withdrawn: CHANGELOG.md).

What it keeps, and why:

- **The step is never slowed or failed by the sink.** A round that raises (the sink down, the
  database gone) is logged by its class only and ends the trailing relay for the rest of the
  try; the claim is given back (:meth:`~triage.jobs.store.JobStore.relay`), so
  ``publish_events`` sends those events and is the task that fails and retries, as before.
- **It never waits for a transaction.** A claim takes only events of transactions older than
  every one still running (``docs/events.md``); a lane's chunk in flight holds back the events
  committed after it began. ``publish_events`` waits for such transactions to end; a trailing
  round does not (``settle_seconds=0``): it takes what is relayable now and the next round,
  after the next commit, takes the rest.
- **Bounded work at the end.** :meth:`close` lets the round in flight finish (one claim, at most
  ``limit`` events: a claim left half-sent would hold the watermark until it runs out) and
  starts no other. A SIGKILL cannot wait: its claim runs out after :data:`CLAIM_SECONDS` and
  the next relay sends it again.
"""

from __future__ import annotations

import logging
import threading
from types import TracebackType

from triage.jobs.store import JobStore
from triage.pipeline.publish import EventSink

log = logging.getLogger(__name__)

RELAY_IN_CLASSIFY_VARIABLE = "triage_relay_in_classify"
"""The Airflow Variable that turns the trailing relay off for every ``classify`` task (``off``):
``publish_events`` relays the whole run after ``persist``, as before (an A/B, or a sink that
should see one relay only)."""

IDLE_SECONDS = 0.25
"""How long a round waits for a commit before it looks again: the leased path's commits do not
wake it, and events held back by a transaction in flight become relayable when it ends."""

TRAILING_LIMIT = 2000
"""Events a trailing round claims at most (the sink's own batch when smaller): a round holds the
interpreter lock while it validates its batch, so a smaller one interleaves with the step's
threads; and :meth:`TrailingRelay.close` waits for at most one."""


CLAIM_SECONDS = 30.0
"""How long a trailing round's claim holds its events from other relays: under ``classify``'s
retry delay (30 s), so that the claim of a try SIGKILLed mid-send has run out when its retry,
``persist`` and ``publish_events`` come, and ``publish_events`` takes it over and sends it first
(the watermark waits for a claim until it runs out; ``publish_events``' own claims hold 300 s).
A send that outlasts it (a webhook slower than 15 ms a request) may be taken over and sent
again by another relay: at least once, never lost."""


class TrailingRelay:
    """Relay committed events through ``sink`` on a thread of its own while a step works.

    Use as a context manager around the step; call :meth:`committed` after each commit (a
    wake-up: without it a round runs every :data:`IDLE_SECONDS`).

    :param store: the step's ledger.
    :param sink: where ``publish_events`` sends the run's events (the same sink, built from the
        same settings).
    :param actor: names the relay in its log lines.
    :param limit: events a round claims at most.
    :param claim_seconds: how long a round's claim holds (:data:`CLAIM_SECONDS`).
    """

    def __init__(
        self,
        store: JobStore,
        sink: EventSink,
        *,
        actor: str,
        limit: int = TRAILING_LIMIT,
        claim_seconds: float = CLAIM_SECONDS,
    ) -> None:
        self.store, self.sink, self.actor, self.claim_seconds = store, sink, actor, claim_seconds
        self.limit = max(1, min(limit, int(getattr(sink, "batch_size", limit))))
        self.sent = 0
        """Events this relay sent (and marked)."""
        self.failed: str | None = None
        """The class of the error that ended it, if one did."""
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._follow, name="triage-trailing-relay", daemon=True)

    def committed(self) -> None:
        """A commit happened: its events may be relayable (cheap; any thread)."""
        self._wake.set()

    def __enter__(self) -> TrailingRelay:
        self._wake.set()  # the first round at once: the events committed before the step began
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop after the round in flight (if any) and wait for it."""
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        if self.failed is None:
            log.info("%s: relayed %d events beside the step", self.actor, self.sent)

    def _follow(self) -> None:
        while True:
            self._wake.wait(IDLE_SECONDS)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                sent = self.store.relay(
                    self.sink.publish,
                    limit=self.limit,
                    actor=self.actor,
                    claim_seconds=self.claim_seconds,
                    settle_seconds=0.0,
                )
            except Exception as exc:  # noqa: BLE001 - the one place a relay error is left to publish_events
                self.failed = type(exc).__name__
                log.warning(
                    "%s: the relay beside the step stopped after %d events (%s); publish_events sends the rest",
                    self.actor,
                    self.sent,
                    self.failed,
                )
                return
            self.sent += sent
            if sent:  # more may be relayable already: the next round without a pause
                self._wake.set()
