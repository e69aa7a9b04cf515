"""The outbox relay's statements: claim, mark published, release. Each runs in a short
transaction of its own; none is open while a relay sends.

A relay claims a batch of unsent events (one ``outbox_claims`` row: a token, the event ids,
``claimed_until``) and commits; sends them; then marks them published, which deletes the claim.
Other relays leave claimed events alone until the claim runs out, so two live relays never take
the same events. A relay that died mid-send leaves a claim that runs out, and another relay
sends those events again: delivery is at least once, and the event id lets a consumer refuse a
duplicate. Claims are taken one at a time (:func:`claim_lock`), so a claim always sees every
claim committed before it.

Nothing here executes anything: :mod:`triage.jobs.store` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import jobs, outbox, outbox_claims

UUID = pg.UUID(as_uuid=True)
NOW = sa.func.now()
CLAIM_LOCK_KEY = 0x6F75_7462_6F78  # "outbox": the advisory lock that takes claims one at a time


@cache
def claim_lock() -> Any:
    """Wait for the claim lock (held until the transaction ends), and commit the relay's
    transaction without waiting for its WAL flush (``synchronous_commit`` off for this
    transaction only). Its own statement: the claim that follows takes its snapshot after the
    lock, so it sees every earlier claim.

    Why no flush: a relay's commit that a server crash loses is a claim or a mark that never
    happened, and both are already allowed. A lost claim leaves its events unclaimed (another
    relay sends them; the first may have sent them too: at least once). A lost mark leaves
    events that the sink holds unpublished in the outbox, sent again: at least once. The sink
    is made durable before the mark is written (the JSON-lines sink fsyncs), so no mark can
    ever stand for an event the sink lost. Other transactions keep waiting for their flush.
    """
    return sa.select(
        sa.func.pg_advisory_xact_lock(CLAIM_LOCK_KEY), sa.func.set_config("synchronous_commit", "off", True)
    )


@cache
def claim_events() -> Any:
    """Claim up to ``:limit`` of the oldest unsent events that no live claim holds, under
    ``:token`` for ``:lease_seconds``, and return each as ``event_id`` and ``event``: the
    ``WorkEvent`` as JSON text (the job's correlation id and payload reference joined; an empty
    ``payload`` is none), oldest first. Deletes the claims that ran out (their events are free
    again).

    JSON built here, one text column a row: the relay validates a whole batch of it in one call
    (:func:`triage.jobs.store.relay.events_from_rows`) instead of decoding nine typed columns a row and
    building each event in Python (24.6 -> ~10 µs of the relay's CPU an event, measured).

    Served by ``outbox_unpublished_idx``; the live claims' ids are hashed once, and the events
    they hold are read and skipped, a number bounded by the relays' batches.
    """
    live = sa.select(sa.func.unnest(outbox_claims.c.event_ids)).where(outbox_claims.c.claimed_until > NOW)
    picked = (
        sa.select(
            outbox.c.event_id,
            outbox.c.job_id,
            outbox.c.event_type,
            outbox.c.schema_version,
            outbox.c.attempt,
            outbox.c.created_at.label("occurred_at"),
            jobs.c.correlation_id,
            jobs.c.payload_ref,
            outbox.c.payload,
        )
        .join_from(outbox, jobs, jobs.c.id == outbox.c.job_id)
        .where(outbox.c.published_at.is_(None), outbox.c.event_id.not_in(live))
        .order_by(outbox.c.created_at)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .cte("picked")
    )
    expired = sa.delete(outbox_claims).where(outbox_claims.c.claimed_until <= NOW).cte("expired")
    claim = (
        sa.insert(outbox_claims)
        .from_select(
            ["token", "claimed_until", "event_ids"],
            sa.select(
                sa.bindparam("token", type_=UUID),
                NOW + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.bindparam("lease_seconds", type_=sa.Float)),
                sa.func.array_agg(picked.c.event_id),
            ).having(sa.func.count() > 0),
        )
        .cte("claim")
    )
    event = sa.func.json_build_object(
        "event_id",
        picked.c.event_id,
        "job_id",
        picked.c.job_id,
        "event_type",
        picked.c.event_type,
        "schema_version",
        picked.c.schema_version,
        "attempt",
        picked.c.attempt,
        "occurred_at",
        picked.c.occurred_at,
        "correlation_id",
        picked.c.correlation_id,
        "payload_ref",
        picked.c.payload_ref,
        "payload",
        sa.func.nullif(picked.c.payload, sa.text("'{}'::jsonb")),
    )
    return (
        sa.select(picked.c.event_id, sa.cast(event, sa.Text).label("event"))
        .order_by(picked.c.occurred_at, picked.c.event_id)
        .add_cte(expired, claim)
    )


@cache
def mark_published() -> Any:
    """Mark the events of the claim ``:token`` published and delete the claim, in one
    statement. Fenced on the claim: once it ran out and another relay took its events over
    (deleting it), this marks nothing and that relay sends them again (at least once)."""
    claim = (
        sa.delete(outbox_claims)
        .where(outbox_claims.c.token == sa.bindparam("token", type_=UUID))
        .returning(outbox_claims.c.event_ids)
        .cte("claim")
    )
    # Probe the outbox by its primary key, the claim's ids one array value (an InitPlan), and
    # no ``published_at IS NULL`` test: with it the planner could walk ``outbox_unpublished_idx``
    # (which it guesses nearly empty when the last ANALYZE saw every event published, and a run's
    # events came in bulk since) and test every unpublished event against every id of the claim:
    # 6-13 s a mark of 5,000 among 191,000 unpublished, measured, growing with the backlog. An
    # event marked already keeps its first ``published_at`` (a claim holds unsent events only,
    # so that is a claim that ran out and was sent again).
    ids = sa.cast(sa.select(claim.c.event_ids).scalar_subquery(), pg.ARRAY(UUID))
    return (
        sa.update(outbox)
        .where(outbox.c.event_id == sa.any_(ids))
        .values(published_at=sa.func.coalesce(outbox.c.published_at, NOW))
    )


@cache
def release_events() -> Any:
    """Give the claim's events back unsent (the sink refused them): the next relay takes them
    at once instead of waiting for the claim to run out."""
    return sa.delete(outbox_claims).where(outbox_claims.c.token == sa.bindparam("token", type_=UUID))
