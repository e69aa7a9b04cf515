"""The outbox relay: send unsent events through a sink and mark them published, in three short
transactions around the send (:mod:`triage.jobs.outbox` has the statements).
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import sqlalchemy as sa

from triage.contracts.events import WorkEvent
from triage.jobs import outbox as O

Transaction = Callable[[str | None], AbstractContextManager[sa.Connection]]
"""A ledger transaction with its actor (:meth:`triage.jobs.ledger.Ledger.transaction`)."""

log = logging.getLogger(__name__)


def relay_events(
    transaction: Transaction,
    publish: Callable[[list[WorkEvent]], None],
    *,
    limit: int,
    actor: str,
    claim_seconds: float,
) -> int:
    """:meth:`triage.jobs.store.JobStore.relay`, in the store's ``transaction``."""
    if limit < 1 or claim_seconds <= 0:
        raise ValueError("relay needs limit >= 1 and claim_seconds > 0")
    token = uuid.uuid4()
    with transaction(None) as conn:  # no job moves here: no actor to set
        conn.execute(O.claim_lock())
        rows = conn.execute(O.claim_events(), {"limit": limit, "token": token, "lease_seconds": claim_seconds}).all()
    if not rows:
        return 0
    fence = {"token": token}
    try:
        events = [event_from_row(r) for r in rows]
        publish(events)
    except BaseException:
        try:
            with transaction(None) as conn:
                conn.execute(O.release_events(), fence)
        except Exception as exc:  # noqa: BLE001 - the sink's error is the one to raise; the claim runs out
            log.warning(
                "%s: claim %s not released (%s); its events wait until it runs out", actor, token, type(exc).__name__
            )
        raise
    with transaction(None) as conn:
        marked = conn.execute(O.mark_published(), fence).rowcount
    if marked < len(events):
        log.warning(
            "%s: %d of %d events sent under claim %s were claimed again after it ran out; they will be sent again",
            actor,
            len(events) - marked,
            len(events),
            token,
        )
    return len(events)


def event_from_row(row: Any) -> WorkEvent:
    """The event of an outbox row (its ``payload`` as JSON text or already decoded); an empty
    payload is none (see :meth:`WorkEvent.to_json`)."""
    payload = row.payload
    if isinstance(payload, str):
        payload = None if payload == "{}" else json.loads(payload)
    return WorkEvent(
        event_id=row.event_id,
        job_id=row.job_id,
        event_type=row.event_type,
        schema_version=row.schema_version,
        attempt=row.attempt,
        occurred_at=row.occurred_at,
        correlation_id=row.correlation_id,
        payload_ref=row.payload_ref,
        payload=payload or None,
    )
