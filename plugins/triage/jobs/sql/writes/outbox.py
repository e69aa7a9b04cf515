"""The outbox relay's statements: claim a range, mark it sent, advance the watermark, release.
Each runs in a short transaction of its own; none is open while a relay sends.

Events are relayed in the order of ``(txid, event_id)``: the id of the transaction that wrote
the event, then the event's id. ``outbox_watermark`` holds the position of the last event
published; every event at or before it is published, and nothing is written per event to say
so (before migration 0029, an ``UPDATE … SET published_at`` of every row, the relay's second
write).

**The trap of a watermark over ids**, and why this one is not in it: ids (a sequence, an
identity, a time) are drawn when a row is written, not when its transaction commits. A
transaction that drew a lower id and commits after one that drew a higher id puts its event
*behind* a watermark that has already passed the higher one: skipped, never sent. Here a claim
reads only the events of transactions older than every transaction still running
(``txid < pg_snapshot_xmin(pg_current_snapshot())``, in the claim's own statement; leaving out
transactions running in another database of the server, which cannot write these tables): each such
transaction has committed (its events visible to the claim) or aborted (it has none), and any
transaction that commits later has a ``txid`` at or above that horizon, so no event can ever
appear at or before a position the relay has read past. The price is latency, never loss: an
open write transaction in this database holds back the events of transactions younger than it
until it ends.

A relay claims the next range after the last claim (or the watermark): one ``outbox_claims`` row
(a token, the range, ``claimed_until``), and commits; sends it; then marks the claim sent and
folds every sent claim that continues the watermark into it. Claims are taken one at a time
(:func:`claim_lock`), so the claims always continue one another from the watermark and two live
relays never take the same events. A relay that died mid-send leaves a claim that runs out, and
the next relay takes it over and sends its range again (at least once; the event id lets a
consumer refuse a duplicate); the watermark cannot pass it until it is sent.

Nothing here executes anything: :mod:`triage.jobs.store` runs these.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import outbox, outbox_claims, outbox_watermark
from triage.jobs.sql.expressions import outbox_position as _position

UUID = pg.UUID(as_uuid=True)
NOW = sa.func.now()
CLAIM_LOCK_KEY = 0x6F75_7462_6F78  # "outbox": the advisory lock that takes claims one at a time


@cache
def claim_lock() -> Any:
    """Wait for the claim lock (held until the transaction ends), and commit the relay's
    transaction without waiting for its WAL flush (``synchronous_commit`` off for this
    transaction only). Its own statement: the claim that follows takes its snapshot after the
    lock, so it sees every earlier claim.

    Why no flush: a relay's commit that a server crash loses is a claim, a mark or an advance
    that never happened, and all are already allowed. A lost claim leaves its range unclaimed
    (another relay sends it; the first may have sent it too: at least once). A lost mark or
    advance leaves events that the sink holds after the watermark, sent again: at least once.
    The sink is made durable before the mark is written (the JSON-lines sink fsyncs), so the
    watermark never passes an event the sink lost. Other transactions keep waiting for their flush.
    """
    return sa.select(
        sa.func.pg_advisory_xact_lock(CLAIM_LOCK_KEY),
        sa.func.set_config("synchronous_commit", "off", True),
        # The claim writes floats as their shortest round-trip digits (:data:`EXACT_JSON`).
        sa.func.set_config("extra_float_digits", "1", True),
    )


# ``WorkEvent.to_json``'s bytes, built by PostgreSQL from one outbox row ({p}: the row's relation).
# What pydantic writes, and how each piece matches it:
# - compact separators, the envelope's fields in the model's order, ``payload`` left out when empty;
# - strings as PostgreSQL's JSON escapes them (``to_json``, a jsonb string's text): ``"``, ``\``,
#   ``\b \f \n \r \t``, other controls as ``\u00xx``; everything else, non-ASCII included, as is;
# - the time in UTC with ``Z``, six-digit microseconds, none when they are zero;
# - the payload's keys in jsonb's own order (the order pydantic read them in before);
# - numbers: an integer (jsonb's text without a fraction) as written; a float as pydantic prints
#   the double it parses: the shortest digits that round-trip (PostgreSQL's ``float8`` text,
#   ``extra_float_digits`` pinned to 1 by :func:`claim_lock`), in positional notation from 1e-5 to
#   1e16 (with ``.0`` when integral), otherwise in exponent notation without leading zeros
#   (``1e-6``; from 1e16 the fallback below). Most floats (a confidence) are already that text: one cast says so.
# A payload this does not cover gives NULL, and the relay validates and serialises that event in
# Python (:class:`triage.jobs.store.relay.RelayedEvents`): a nested object or array, a float whose
# jsonb text is longer than 300 characters (below ~1e-298: a cast to float8 could fail), a float of
# 1e16 or more (its jsonb text has a fraction: a numeric, never a Python float, whose JSON is an
# integer there). Such a double is integral, and ``float8`` text writes every digit of one below
# about 2^64 (``2.4259396595948512e+16``) where pydantic writes the shortest (``2.425939659594851e+16``).
_NUMBER = """CASE
        WHEN strpos(e.value::text, '.') = 0 THEN e.value::text
        WHEN length(e.value::text) > 300 THEN NULL
        WHEN abs(e.value::float8) >= 1e16 THEN NULL
        WHEN e.value::float8::text = e.value::text THEN e.value::text
        WHEN e.value::float8 = 0 THEN '0.0'
        WHEN abs(e.value::float8) >= 1e-5 THEN
             CASE WHEN strpos(e.value::float8::text::numeric::text, '.') = 0
                  THEN e.value::float8::text::numeric::text || '.0'
                  ELSE e.value::float8::text::numeric::text END
        ELSE replace(replace(e.value::float8::text, 'e-0', 'e-'), 'e+0', 'e+')
    END"""
_VALUE = f"""CASE jsonb_typeof(e.value)
        WHEN 'string' THEN e.value::text
        WHEN 'boolean' THEN e.value::text
        WHEN 'null' THEN 'null'
        WHEN 'number' THEN {_NUMBER}
    END"""
_PAYLOAD = f"""CASE WHEN {{p}}.payload = '{{{{}}}}'::jsonb THEN '' ELSE (
    SELECT CASE WHEN array_position(s.pairs, NULL) IS NULL
                THEN ',"payload":{{{{' || array_to_string(s.pairs, ',') || '}}}}' END
      FROM (SELECT array_agg(to_json(e.key)::text || ':' || {_VALUE} ORDER BY e.n) AS pairs
              FROM jsonb_each({{p}}.payload) WITH ORDINALITY AS e(key, value, n)) AS s
) END"""
_TIME = "({p}.created_at AT TIME ZONE 'UTC')"
OCCURRED_AT = f"""to_char({_TIME}, 'YYYY-MM-DD"T"HH24:MI:SS')
    || CASE WHEN date_trunc('second', {_TIME}) = {_TIME} THEN '' ELSE to_char({_TIME}, '.US') END || 'Z'"""
EXACT_JSON = f"""'{{{{"event_id":"' || {{p}}.event_id::text
    || '","job_id":"' || {{p}}.job_id::text
    || '","event_type":' || to_json({{p}}.event_type)::text
    || ',"schema_version":' || {{p}}.schema_version::text
    || ',"attempt":' || {{p}}.attempt::text
    || ',"occurred_at":"' || {OCCURRED_AT}
    || '","correlation_id":' || to_json({{p}}.correlation_id)::text
    || ',"payload_ref":' || to_json({{p}}.payload_ref)::text
    || {_PAYLOAD}
    || '}}}}'"""


def exact_json(relation: str) -> Any:
    """``WorkEvent.to_json`` of each row of the outbox relation named ``relation``, as text, or
    NULL where the payload holds what this SQL does not reproduce byte for byte (:data:`EXACT_JSON`)."""
    return sa.literal_column(EXACT_JSON.format(p=relation), sa.Text)


EXACT_START = '{"event_id":"'
"""How every event :func:`exact_json` builds begins, and no other :func:`events_json` gives: the
fallback is ``json_build_object``'s text, which writes ``{"event_id" : "``."""


def events_json(picked: Any) -> Any:
    """Each picked row, in relay order, as one text column ``event``: ``WorkEvent.to_json``'s bytes
    (:func:`exact_json`, recognised by :data:`EXACT_START`), which the sinks write through without
    building a model (the envelope was checked where the row was written: migration 0034); where
    the SQL does not cover the row (a payload it does not reproduce, a row before 0029), the event
    as ``json_build_object`` writes it, for the relay to validate and serialise in Python.

    One column, fetched as scalars: no row object and no id decoded an event in Python (the id
    is the text's own, at a fixed offset: :class:`triage.jobs.store.relay.RelayedEvents`).
    """
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
        # UTC with ``Z`` whatever the session's TimeZone and DateStyle, as the exact JSON writes it.
        sa.literal_column(OCCURRED_AT.format(p=picked.name), sa.Text),
        "correlation_id",
        picked.c.correlation_id,
        "payload_ref",
        picked.c.payload_ref,
        "payload",
        sa.func.nullif(picked.c.payload, sa.text("'{}'::jsonb")),
    )
    return sa.select(sa.func.coalesce(exact_json(picked.name), sa.cast(event, sa.Text)).label("event")).order_by(
        picked.c.txid, picked.c.event_id
    )


EVENT_COLUMNS = (
    outbox.c.event_id,
    outbox.c.job_id,
    outbox.c.event_type,
    outbox.c.schema_version,
    outbox.c.attempt,
    outbox.c.created_at,
    outbox.c.correlation_id,
    outbox.c.payload_ref,
    outbox.c.payload,
    outbox.c.txid,
)


def _chain_end() -> Any:
    """Where the next claim starts: the end of the last claim, else the watermark (a CTE)."""
    ends = sa.union_all(
        sa.select(outbox_claims.c.upto_txid.label("txid"), outbox_claims.c.upto_event_id.label("event_id")),
        sa.select(outbox_watermark.c.txid, outbox_watermark.c.event_id),
    ).subquery("ends")
    return (
        sa.select(ends.c.txid, ends.c.event_id)
        .order_by(ends.c.txid.desc(), ends.c.event_id.desc())
        .limit(1)
        .cte("start")
    )


def _horizon() -> ColumnElement[Any]:
    """The oldest transaction running now that may write this database, as a ``txid``: every
    transaction below it that wrote an event has ended (``triage.outbox_horizon()``, migration
    0029: ``pg_snapshot_xmin`` of the statement's snapshot, leaving out the transactions that
    ``pg_stat_activity`` shows running in another database of the server)."""
    return sa.func.triage.outbox_horizon(type_=sa.BigInteger)


def _until() -> ColumnElement[Any]:
    return NOW + sa.func.make_interval(0, 0, 0, 0, 0, 0, sa.bindparam("lease_seconds", type_=sa.Float))


@cache
def claim_events() -> Any:
    """Claim, under ``:token`` for ``:lease_seconds``, up to ``:limit`` events after the last
    claim (none: the watermark) and return them (:func:`events_json`). Only events of transactions
    older than every transaction running now (the module's docstring says why): the claim's
    range can never gain an event later.

    Served by ``outbox_relay_order_idx`` (a merge of each day partition's, in order): the start
    and the horizon are InitPlans, so the scan begins at the start and stops after ``:limit``.
    """
    start = _chain_end()
    horizon = _horizon()
    picked = (
        sa.select(*EVENT_COLUMNS)
        .where(
            _position(outbox.c.txid, outbox.c.event_id)
            > _position(sa.select(start.c.txid).scalar_subquery(), sa.select(start.c.event_id).scalar_subquery()),
            outbox.c.txid < sa.select(horizon).scalar_subquery(),
        )
        .order_by(outbox.c.txid, outbox.c.event_id)
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .cte("picked")
    )
    last = (
        sa.select(picked.c.txid, picked.c.event_id)
        .order_by(picked.c.txid.desc(), picked.c.event_id.desc())
        .limit(1)
        .cte("last")
    )
    claim = (
        sa.insert(outbox_claims)
        .from_select(
            ["token", "claimed_until", "after_txid", "after_event_id", "upto_txid", "upto_event_id", "events"],
            sa.select(
                sa.bindparam("token", type_=UUID),
                _until(),
                start.c.txid,
                start.c.event_id,
                last.c.txid,
                last.c.event_id,
                sa.select(sa.func.count()).select_from(picked).scalar_subquery(),
            ).select_from(start.join(last, sa.true())),
        )
        .cte("claim")
    )
    return events_json(picked).add_cte(claim)


@cache
def held_back() -> Any:
    """When committed events wait after the last claim that no claim may take yet (written by a
    transaction younger than one still running): the ``txid`` the horizon must reach for every
    transaction running now to have ended; else NULL. The relay waits for it
    (:func:`triage.jobs.store.relay.relay_events`) rather than leave those events unsent."""
    start = _chain_end()
    position = _position(outbox.c.txid, outbox.c.event_id)
    after = _position(sa.select(start.c.txid).scalar_subquery(), sa.select(start.c.event_id).scalar_subquery())
    waiting = (
        sa.select(sa.literal(1))
        .where(position > after, outbox.c.txid >= sa.select(_horizon()).scalar_subquery())
        .exists()
    )
    xmax = sa.cast(sa.cast(sa.func.pg_snapshot_xmax(sa.func.pg_current_snapshot()), sa.Text), sa.BigInteger)
    return sa.select(sa.case((waiting, xmax)))


@cache
def horizon() -> Any:
    """The oldest transaction running now, as a ``txid`` (none running: the next one's)."""
    return sa.select(_horizon())


@cache
def take_over_expired() -> Any:
    """Take over, under ``:new_token`` for ``:lease_seconds``, the oldest claim that ran out unsent
    (its relay died, or hangs), and return its events to send again: the watermark cannot pass
    them otherwise. Nothing when no claim ran out."""
    expired = (
        sa.select(outbox_claims.c.token)
        .where(~outbox_claims.c.sent, outbox_claims.c.claimed_until <= NOW)
        .order_by(outbox_claims.c.after_txid, outbox_claims.c.after_event_id)
        .limit(1)
        .scalar_subquery()
    )
    taken = (
        sa.update(outbox_claims)
        .where(outbox_claims.c.token == expired)
        .values(token=sa.bindparam("new_token", type_=UUID), claimed_until=_until())
        .returning(
            outbox_claims.c.after_txid,
            outbox_claims.c.after_event_id,
            outbox_claims.c.upto_txid,
            outbox_claims.c.upto_event_id,
        )
        .cte("taken")
    )
    position = _position(outbox.c.txid, outbox.c.event_id)
    picked = (
        sa.select(*EVENT_COLUMNS)
        .where(
            position
            > _position(
                sa.select(taken.c.after_txid).scalar_subquery(), sa.select(taken.c.after_event_id).scalar_subquery()
            ),
            position
            <= _position(
                sa.select(taken.c.upto_txid).scalar_subquery(), sa.select(taken.c.upto_event_id).scalar_subquery()
            ),
        )
        .cte("picked")
    )
    return events_json(picked)


@cache
def mark_published() -> Any:
    """Mark the claim ``:claim_token`` sent; returns its number of events. Fenced on the token: once the
    claim ran out and another relay took it over, this marks nothing (that relay sends its
    events again: at least once). :func:`advance_watermark` follows, in the same transaction."""
    return (
        sa.update(outbox_claims)
        .where(outbox_claims.c.token == sa.bindparam("claim_token", type_=UUID), ~outbox_claims.c.sent)
        .values(sent=True)
        .returning(outbox_claims.c.events)
    )


@cache
def advance_watermark() -> Any:
    """Move the watermark to the end of the longest run of sent claims that continues it, and
    delete those claims: one row updated, however many events they held. A sent claim behind one
    still being sent waits for it (its events count as unsent until then)."""
    first = outbox_claims.alias("head")
    chain = (
        sa.select(first.c.token, first.c.upto_txid, first.c.upto_event_id, sa.literal(1).label("depth"))
        .join_from(
            first,
            outbox_watermark,
            sa.and_(
                first.c.after_txid == outbox_watermark.c.txid, first.c.after_event_id == outbox_watermark.c.event_id
            ),
        )
        .where(first.c.sent)
        .cte("chain", recursive=True)
    )
    following = outbox_claims.alias("following")
    chain = chain.union_all(
        sa.select(following.c.token, following.c.upto_txid, following.c.upto_event_id, chain.c.depth + 1)
        .join_from(
            following,
            chain,
            sa.and_(following.c.after_txid == chain.c.upto_txid, following.c.after_event_id == chain.c.upto_event_id),
        )
        .where(following.c.sent)
    )
    folded = sa.delete(outbox_claims).where(outbox_claims.c.token.in_(sa.select(chain.c.token))).cte("folded")
    last = sa.select(chain.c.upto_txid, chain.c.upto_event_id).order_by(chain.c.depth.desc()).limit(1).subquery("last")
    return (
        sa.update(outbox_watermark)
        # Forward only (and the join the linter asks for): the chain starts at the watermark.
        .where(
            _position(last.c.upto_txid, last.c.upto_event_id)
            > _position(outbox_watermark.c.txid, outbox_watermark.c.event_id)
        )
        .values(txid=last.c.upto_txid, event_id=last.c.upto_event_id, advanced_at=NOW)
        .add_cte(folded)
    )


@cache
def release_events() -> Any:
    """Give the events of the claim ``:claim_token`` back unsent (the sink refused them): the next relay takes them
    at once instead of waiting for the claim to run out. The last claim is deleted (the next
    claims its range afresh); one that another claim continues is kept, run out, so that the
    next relay takes it over (deleting it would leave a gap no claim starts from)."""
    mine = sa.and_(outbox_claims.c.token == sa.bindparam("claim_token", type_=UUID), ~outbox_claims.c.sent)
    following = outbox_claims.alias("following")
    continued = (
        sa.select(sa.literal(1))
        .where(
            following.c.after_txid == outbox_claims.c.upto_txid,
            following.c.after_event_id == outbox_claims.c.upto_event_id,
        )
        .exists()
    )
    run_out = (
        sa.update(outbox_claims)
        .where(mine, continued)
        .values(claimed_until=sa.literal("-infinity").cast(sa.DateTime(timezone=True)))
        .cte("run_out")
    )
    return sa.delete(outbox_claims).where(mine, ~continued).add_cte(run_out)
