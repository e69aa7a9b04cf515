"""The relay's published-up-to watermark on a real PostgreSQL (migration 0029): at least once
across a relay that dies after sending, two relays that never lose or double-advance, and
events committed out of the order of their ids never skipped (two real connections).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs, settle_outbox
from triage.contracts.events import WorkEvent
from triage.database import DatabaseUrl
from triage.jobs.sql.writes import outbox as O
from triage.jobs.store import JobStore
from triage.jobs.store.relay import relay_events

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def ids_of(claimed: sa.CursorResult[Any]) -> list[str]:
    """The ids of a claim's events, in order (each row is the event's JSON)."""
    return [json.loads(text)["event_id"] for text in claimed.scalars()]


UNSENT = (
    "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)"
)


class Killed(BaseException):
    """The relay's process dies here: nothing after it runs."""


class DyingStore(JobStore):
    """The store; once ``die`` is set, its next transaction kills the relay (after a send,
    before the transaction that marks it and advances the watermark)."""

    die = False

    def transaction(self, actor: str | None = "triage") -> AbstractContextManager[sa.Connection]:  # type: ignore[override]  # the seam returns the store's own
        if self.die:
            raise Killed
        return super().transaction(actor)


def scalar(store: JobStore, sql: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def all_ids(store: JobStore) -> list[str]:
    with store.engine.connect() as conn:
        return [
            str(i)
            for i in conn.execute(sa.text("SELECT event_id FROM triage.outbox ORDER BY txid, event_id")).scalars()
        ]


def watermark_is_last_event(store: JobStore) -> bool:
    return bool(
        scalar(
            store,
            "SELECT (w.txid, w.event_id) = (SELECT txid, event_id FROM triage.outbox ORDER BY txid DESC, event_id DESC"
            " LIMIT 1) FROM triage.outbox_watermark w",
        )
    )


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_relay_that_dies_after_sending_and_before_advancing_sends_again(store: JobStore) -> None:
    store.register(new_jobs(25), batch_key=BATCH, step="classify", max_attempts=3)
    dying = DyingStore(store.engine)
    first: list[str] = []

    def publish(events: Sequence[WorkEvent]) -> None:
        first.extend(str(e.event_id) for e in events)
        dying.die = len(first) == 20  # the second batch is out; its mark never happens

    with pytest.raises(Killed):
        dying.relay_all(publish, limit=10, claim_seconds=0.3)
    assert len(first) == 20
    assert scalar(store, UNSENT) == 15  # the watermark stands after the first batch
    time.sleep(0.4)  # the dead relay's claim runs out
    again: list[str] = []
    assert store.relay_all(lambda events: again.extend(str(e.event_id) for e in events), limit=10) == 15
    assert again[:10] == first[10:]  # the dead relay's batch, sent again first: at least once
    assert sorted(first[:10] + again) == sorted(all_ids(store))
    assert scalar(store, UNSENT) == 0
    assert watermark_is_last_event(store)
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_sent_range_behind_one_still_being_sent_does_not_move_the_watermark(store: JobStore) -> None:
    """Two relays, A and B, claim one range each (A first); B finishes first. The watermark must
    stay before A's range (advancing it to B's end would skip A's events if A then dies), and
    move over both once A finishes: never past an unsent event, never twice."""
    store.register(new_jobs(20), batch_key=BATCH, step="classify", max_attempts=3)
    a, b = uuid.uuid4(), uuid.uuid4()
    settle_outbox(store)
    with store.transaction(None) as conn:
        conn.execute(O.claim_lock())
        a_events = ids_of(conn.execute(O.claim_events(), {"limit": 8, "token": a, "lease_seconds": 60.0}))
    with store.transaction(None) as conn:
        conn.execute(O.claim_lock())
        b_events = ids_of(conn.execute(O.claim_events(), {"limit": 8, "token": b, "lease_seconds": 60.0}))
    assert len(a_events) == len(b_events) == 8
    assert set(a_events).isdisjoint(b_events)
    with store.transaction(None) as conn:  # B is done first
        conn.execute(O.claim_lock())
        assert conn.execute(O.mark_published(), {"claim_token": b}).scalar() == 8
        assert conn.execute(O.advance_watermark()).rowcount == 0
    assert scalar(store, UNSENT) == 20
    with store.transaction(None) as conn:  # B's late second mark marks nothing
        assert conn.execute(O.mark_published(), {"claim_token": b}).rowcount == 0
    with store.transaction(None) as conn:  # then A
        conn.execute(O.claim_lock())
        assert conn.execute(O.mark_published(), {"claim_token": a}).scalar() == 8
        assert conn.execute(O.advance_watermark()).rowcount == 1
    assert scalar(store, UNSENT) == 4
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0
    rest: list[str] = []
    assert store.relay_all(lambda events: rest.extend(str(e.event_id) for e in events)) == 4
    assert sorted([*a_events, *b_events, *rest]) == sorted(all_ids(store))
    assert watermark_is_last_event(store)


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_failed_range_between_two_claims_is_taken_over_not_lost(store: JobStore) -> None:
    """A's sink fails and A gives its range back while B holds the range after it: the range is
    kept (run out) and the next relay sends it, then the watermark passes both."""
    store.register(new_jobs(12), batch_key=BATCH, step="classify", max_attempts=3)
    a, b = uuid.uuid4(), uuid.uuid4()
    settle_outbox(store)
    with store.transaction(None) as conn:
        conn.execute(O.claim_lock())
        a_events = ids_of(conn.execute(O.claim_events(), {"limit": 5, "token": a, "lease_seconds": 60.0}))
        conn.execute(O.claim_events(), {"limit": 5, "token": b, "lease_seconds": 60.0}).all()
    with store.transaction(None) as conn:
        conn.execute(O.release_events(), {"claim_token": a})
        conn.execute(O.mark_published(), {"claim_token": b})
        conn.execute(O.advance_watermark())
    sent: list[str] = []
    assert store.relay_all(lambda events: sent.extend(str(e.event_id) for e in events), limit=5) == 7
    assert sent[:5] == a_events
    assert scalar(store, UNSENT) == 0
    assert watermark_is_last_event(store)


def _insert_event(conn: psycopg.Connection[Any], n: int) -> str:
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO triage.outbox (event_id, job_id, event_type, schema_version, attempt, correlation_id, payload_ref)"
        " VALUES (%s, %s, 'job.registered', 1, 0, %s, %s)",
        (event_id, str(uuid.uuid4()), f"corr-{n}", f"file:///payloads/{n}"),
    )
    return event_id


def _relay(store: JobStore, sent: list[str], settle_seconds: float) -> int:
    return relay_events(
        store.transaction,
        lambda events: sent.extend(str(e.event_id) for e in events),
        limit=100,
        actor="test",
        claim_seconds=60.0,
        batches=None,
        settle_seconds=settle_seconds,
    )


def test_an_event_committed_after_a_later_written_one_is_not_skipped(store: JobStore, db_url: DatabaseUrl) -> None:
    """The trap of every id watermark: transaction 1 writes its event first (the lower txid),
    transaction 2 writes one later and commits first, the relay runs, then 1 commits. A
    watermark moved past 2's event would leave 1's behind it, never sent. Here the relay holds
    2's event back while 1 is open (it reads below the oldest running transaction only), and
    sends both, 1's first, once 1 commits."""
    with psycopg.connect(db_url.libpq(), autocommit=True) as before:
        e0 = _insert_event(before, 0)
    with psycopg.connect(db_url.libpq()) as one, psycopg.connect(db_url.libpq()) as two:
        e1 = _insert_event(one, 1)  # open: lower txid, commits last
        e2 = _insert_event(two, 2)
        two.commit()
        t1, t2 = (
            conn.execute("SELECT txid FROM triage.outbox WHERE event_id = %s", (e,)).fetchone()
            for conn, e in ((one, e1), (two, e2))
        )
        assert t1 is not None
        assert t2 is not None
        assert t1[0] < t2[0]
        sent: list[str] = []
        _relay(store, sent, settle_seconds=1.0)  # waits for 1 a second, in vain
        assert sent == [e0]  # 2's event waits: 1 is still running
        assert scalar(store, UNSENT) == 1  # 2's (1's is not committed yet)
        one.commit()
    _relay(store, sent, settle_seconds=10.0)
    assert sent == [e0, e1, e2]
    assert scalar(store, UNSENT) == 0


def test_a_relay_waits_for_a_running_transaction_that_holds_committed_events_back(
    store: JobStore, db_url: DatabaseUrl
) -> None:
    """A worker's write transaction is open (it has its id) when a run's events commit after it:
    the relay neither takes them (they may have a predecessor still to commit) nor stops with
    them unsent; it sends them as soon as that transaction ends."""
    with psycopg.connect(db_url.libpq()) as worker:
        worker.execute("SELECT pg_current_xact_id()")  # a write transaction in flight
        store.register(new_jobs(5), batch_key=BATCH, step="classify", max_attempts=3)
        threading.Timer(0.5, worker.commit).start()
        sent: list[str] = []
        started = time.monotonic()
        assert _relay(store, sent, settle_seconds=10.0) == 5
        assert 0.4 < time.monotonic() - started < 9.0
    assert scalar(store, UNSENT) == 0


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_write_transaction_in_another_database_holds_nothing_back(store: JobStore, pg_server: DatabaseUrl) -> None:
    """Airflow's metadata database may share the server: its open write transaction cannot
    write the outbox, so the relay does not wait for it (``triage.outbox_horizon()``)."""
    with psycopg.connect(pg_server.libpq()) as elsewhere:  # the server's ``postgres`` database
        elsewhere.execute("SELECT pg_current_xact_id()")  # a write transaction, open throughout
        store.register(new_jobs(5), batch_key=BATCH, step="classify", max_attempts=3)
        sent: list[str] = []
        started = time.monotonic()
        assert _relay(store, sent, settle_seconds=10.0) == 5
        assert time.monotonic() - started < 5.0
        elsewhere.rollback()


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_the_unsent_counts_follow_the_watermark(store: JobStore) -> None:
    """The reconciliation's outbox lag and the batch summary count the events after the watermark."""
    from triage.jobs.sql.reads import checks
    from triage.jobs.sql.reads.batch_summary import batch_summary

    store.register(new_jobs(6), batch_key=BATCH, step="classify", max_attempts=3)
    with store.engine.connect() as conn:
        assert conn.execute(checks.outbox_lag(), {"threshold": 3600.0}).one().unsent == 6
    assert store.relay(lambda events: None, limit=4) == 4
    with store.engine.connect() as conn:
        assert conn.execute(checks.outbox_lag(), {"threshold": 3600.0}).one().unsent == 2
    with store.engine.connect() as conn:
        assert batch_summary(conn, BATCH).events_unpublished == 2
