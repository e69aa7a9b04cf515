"""The outbox relay: send unsent events through a sink and mark them published, batch after
batch, one short transaction between two sends (:mod:`triage.jobs.sql.writes.outbox` has the statements).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa
from pydantic import TypeAdapter

from triage.contracts.events import WorkEvent
from triage.jobs.sql.writes import outbox as O

Transaction = Callable[[str | None], AbstractContextManager[sa.Connection]]
"""A ledger transaction with its actor (:meth:`triage.jobs.store.ledger.Ledger.transaction`)."""

log = logging.getLogger(__name__)


def relay_events(
    transaction: Transaction,
    publish: Callable[[list[WorkEvent]], None],
    *,
    limit: int,
    actor: str,
    claim_seconds: float,
    batches: int | None = 1,
) -> int:
    """:meth:`triage.jobs.store.JobStore.relay` (one batch) and
    :meth:`~triage.jobs.store.JobStore.relay_all` (``batches=None``: until none is left), in the
    store's ``transaction``.

    A stream of batches: claim a batch, send it, then mark it published and claim the next in
    one transaction, so a batch costs one commit, none flushed (:func:`triage.jobs.sql.writes.outbox.claim_lock`
    says why that is safe). No transaction is open while ``publish`` runs. Events go out
    oldest first, batch after batch; each is sent once unless a claim ran out (at least once).
    """
    if limit < 1 or claim_seconds <= 0:
        raise ValueError("relay needs limit >= 1 and claim_seconds > 0")
    params = {"limit": limit, "lease_seconds": claim_seconds}
    token = uuid.uuid4()
    with transaction(None) as conn:  # no job moves here: no actor to set
        rows = _claim(conn, token, params)
    sent = 0
    while rows:
        events = _send(transaction, publish, rows, token, actor)
        sent += len(events)
        done, batches = token, None if batches is None else batches - 1
        token = uuid.uuid4()
        with transaction(None) as conn:
            marked = conn.execute(O.mark_published(), {"token": done}).rowcount
            rows = _claim(conn, token, params) if batches != 0 else []
        if marked < len(events):
            log.warning(
                "%s: %d of %d events sent under claim %s were claimed again after it ran out; they will be sent again",
                actor,
                len(events) - marked,
                len(events),
                done,
            )
    return sent


def _claim(conn: sa.Connection, token: uuid.UUID, params: dict[str, Any]) -> list[Any]:
    conn.execute(O.claim_lock())
    return list(conn.execute(O.claim_events(), {**params, "token": token}).all())


def _send(
    transaction: Transaction, publish: Callable[[list[WorkEvent]], None], rows: list[Any], token: uuid.UUID, actor: str
) -> list[WorkEvent]:
    """Send the claimed rows' events; if that fails, release the claim (its events go out next
    time) and raise."""
    try:
        events = events_from_rows(rows)
        publish(events)
    except BaseException:
        try:
            with transaction(None) as conn:
                conn.execute(O.release_events(), {"token": token})
        except Exception as exc:  # noqa: BLE001 - the sink's error is the one to raise; the claim runs out
            log.warning(
                "%s: claim %s not released (%s); its events wait until it runs out", actor, token, type(exc).__name__
            )
        raise
    return events


EVENTS = TypeAdapter(list[WorkEvent])


def events_from_rows(rows: Sequence[Any]) -> list[WorkEvent]:
    """The events of claimed outbox rows (each ``event`` JSON text, :func:`triage.jobs.sql.writes.outbox.claim_events`),
    validated against the contract in one call: a row that is not a valid event fails the batch."""
    return EVENTS.validate_json("[" + ",".join(r.event for r in rows) + "]")
