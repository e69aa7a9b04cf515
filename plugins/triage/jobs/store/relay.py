"""The outbox relay: send unsent events through a sink and advance the published-up-to
watermark, batch after batch, one short transaction between two sends
(:mod:`triage.jobs.sql.writes.outbox` has the statements and says why the watermark skips nothing).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, overload

import sqlalchemy as sa
from pydantic import TypeAdapter

from triage.contracts.events import WorkEvent
from triage.jobs.sql.writes import outbox as O

Transaction = Callable[[str | None], AbstractContextManager[sa.Connection]]
"""A ledger transaction with its actor (:meth:`triage.jobs.store.ledger.Ledger.transaction`)."""

Publish = Callable[[Sequence[WorkEvent]], None]
"""What the relay hands each claimed batch to: a sequence of events (a :class:`RelayedEvents`)."""

log = logging.getLogger(__name__)

SETTLE_SECONDS = 10.0
"""How long a relay waits for a running transaction that holds committed events back (a write
transaction open longer than this leaves them to the next relay; reconciliation reports them
as outbox lag once they are old)."""


def relay_events(
    transaction: Transaction,
    publish: Publish,
    *,
    limit: int,
    actor: str,
    claim_seconds: float,
    batches: int | None = 1,
    settle_seconds: float = SETTLE_SECONDS,
) -> int:
    """:meth:`triage.jobs.store.JobStore.relay` (one batch) and
    :meth:`~triage.jobs.store.JobStore.relay_all` (``batches=None``: until none is left), in the
    store's ``transaction``.

    A stream of batches: claim a range, send it, then mark it sent, advance the watermark and
    claim the next in one transaction, so a batch costs one commit, none flushed
    (:func:`triage.jobs.sql.writes.outbox.claim_lock` says why that is safe), and no write per
    event. No transaction is open while ``publish`` runs. Events go out in the order their
    transactions wrote them, batch after batch; each is sent once unless a claim ran out (at
    least once: a claim that ran out is taken over and sent again before anything new).

    A claim takes only events of transactions older than every one still running (the
    watermark's rule). So that a relay sends every event committed before it started, it first
    waits (up to ``settle_seconds``, polling) for the transactions running then to end when
    committed events wait behind one of them: a worker's commit in flight, a moment. Events
    committed while it streams and held back at its end are the next relay's.
    """
    if limit < 1 or claim_seconds <= 0:
        raise ValueError("relay needs limit >= 1 and claim_seconds > 0")
    params = {"limit": limit, "lease_seconds": claim_seconds}
    token = uuid.uuid4()
    with transaction(None) as conn:  # no job moves here: no actor to set
        target = conn.execute(O.held_back()).scalar()
        rows = _claim(conn, token, params) if target is None else []
    if target is not None:
        settle(transaction, target, settle_seconds)
        with transaction(None) as conn:
            rows = _claim(conn, token, params)
    sent = 0
    while rows:
        events = _send(transaction, publish, rows, token, actor)
        sent += len(events)
        done, batches = token, None if batches is None else batches - 1
        token = uuid.uuid4()
        with transaction(None) as conn:
            conn.execute(O.claim_lock())
            marked = conn.execute(O.mark_published(), {"claim_token": done}).scalar()
            conn.execute(O.advance_watermark())
            rows = _claim(conn, token, params) if batches != 0 else []
        if marked is None:
            log.warning(
                "%s: the %d events sent under claim %s were taken over after it ran out; they will be sent again",
                actor,
                len(events),
                done,
            )
    return sent


def _claim(conn: sa.Connection, token: uuid.UUID, params: dict[str, Any]) -> list[str]:
    """A claim that ran out first (its range is behind every other), else the next range: each
    event's JSON (:func:`triage.jobs.sql.writes.outbox.events_json`)."""
    conn.execute(O.claim_lock())
    # Scalars fetched in one call: no ``fetchone`` a row (~2 µs an event), no row objects (~1 µs).
    taken = {"lease_seconds": params["lease_seconds"], "new_token": token}
    texts = conn.execute(O.take_over_expired(), taken).scalars().all()
    return list(texts or conn.execute(O.claim_events(), {**params, "token": token}).scalars().all())


def settle(transaction: Transaction, target: int, settle_seconds: float) -> None:
    """Wait until the horizon reaches ``target`` (:func:`triage.jobs.sql.writes.outbox.held_back`:
    every transaction running then has ended), polling 10 ms doubling to 200 ms, for up to
    ``settle_seconds``. Never for transactions that start later: a busy ledger cannot starve
    the relay."""
    deadline = time.monotonic() + settle_seconds
    pause = 0.01
    while time.monotonic() < deadline:
        time.sleep(pause)
        pause = min(2 * pause, 0.2)
        with transaction(None) as conn:
            if conn.execute(O.horizon()).scalar_one() >= target:
                return


def _send(transaction: Transaction, publish: Publish, rows: list[str], token: uuid.UUID, actor: str) -> RelayedEvents:
    """Send the claimed events; if that fails, release the claim (its events go out next time)
    and raise."""
    try:
        events = RelayedEvents(rows)
        publish(events)
    except BaseException:
        try:
            with transaction(None) as conn:
                conn.execute(O.release_events(), {"claim_token": token})
        except Exception as exc:  # noqa: BLE001 - the sink's error is the one to raise; the claim runs out
            log.warning(
                "%s: claim %s not released (%s); its events wait until it runs out", actor, token, type(exc).__name__
            )
        raise
    return events


EVENTS = TypeAdapter(list[WorkEvent])

_EXACT_ID = slice(len(O.EXACT_START), len(O.EXACT_START) + 36)
"""Where an exact text's id is: its own, the 36 characters after :data:`~triage.jobs.sql.writes.outbox.EXACT_START`."""


class RelayedEvents(Sequence[WorkEvent]):
    """A claimed batch as the relay hands it to ``publish``: a sequence of :class:`WorkEvent`
    built only if someone reads one, and each event's JSON as the claim returned it.

    The claim gives most events as ``WorkEvent.to_json``'s own bytes, made by PostgreSQL
    (:func:`triage.jobs.sql.writes.outbox.exact_json`, each beginning with
    :data:`~triage.jobs.sql.writes.outbox.EXACT_START`), their envelope checked where the row was
    written (migration 0034): :meth:`lines` passes them through untouched, and a sink that writes
    JSON (:mod:`triage.pipeline.publish`) never builds a model. The others (a payload the SQL does
    not reproduce byte for byte) are validated and serialised here, so an invalid one still fails
    the batch. Indexing or iterating validates the whole batch in one call, as the relay always
    did, for a ``publish`` that wants models.
    """

    __slots__ = ("_events", "_lines", "_texts")

    def __init__(self, texts: Sequence[str]) -> None:
        self._texts = list(texts)
        self._events: list[WorkEvent] | None = None
        self._lines: tuple[list[str], list[str]] | None = None

    def lines(self) -> tuple[list[str], list[str]]:
        """Each event's id (as ``str(uuid)`` writes it) and JSON, exactly ``WorkEvent.to_json()``
        decoded, in relay order; raises ``pydantic.ValidationError`` for a row that is no valid event."""
        if self._lines is None:
            texts = self._texts
            ids = [text[_EXACT_ID] for text in texts]
            others = [i for i, text in enumerate(texts) if not text.startswith(O.EXACT_START)]
            if others:
                texts = list(texts)
                for i, event in zip(
                    others, EVENTS.validate_json("[" + ",".join(texts[i] for i in others) + "]"), strict=True
                ):
                    ids[i], texts[i] = str(event.event_id), event.to_json().decode()
            self._lines = ids, texts
        return self._lines

    def events(self) -> list[WorkEvent]:
        """The batch as validated models (built once, in one call)."""
        if self._events is None:
            self._events = EVENTS.validate_json("[" + ",".join(self._texts) + "]")
        return self._events

    def __len__(self) -> int:
        return len(self._texts)

    @overload
    def __getitem__(self, index: int) -> WorkEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[WorkEvent]: ...

    def __getitem__(self, index: int | slice) -> WorkEvent | list[WorkEvent]:
        return self.events()[index]

    def __iter__(self) -> Iterator[WorkEvent]:
        return iter(self.events())
