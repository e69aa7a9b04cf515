"""The streaming relay (issue #16, item 1) on a real PostgreSQL and a real events file: batch
after batch, one transaction between two sends, oldest first, and across a crash or a failing
sink every event in the file once.

That the relay's cost does not grow with history is a benchmark ratio, not a timed assertion
here: ``python -m bench relay`` (the last of four rounds, with three rounds published before,
against the first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs, outbox_row_json, settle_outbox
from triage.contracts.events import WorkEvent, parse_event
from triage.jobs.store import JobStore
from triage.pipeline.publish import JsonlEventSink

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


class Killed(BaseException):
    """The relay's process dies here: nothing after it runs, not even a release."""


class CountingStore(JobStore):
    """The store, counting its transactions; once ``die`` is set, the next one kills the relay."""

    def __init__(self, engine: sa.Engine) -> None:
        super().__init__(engine)
        self.transactions = 0
        self.die = False

    def transaction(self, actor: str | None = "triage") -> AbstractContextManager[sa.Connection]:  # type: ignore[override]  # the seam returns the store's own
        if self.die:
            raise Killed
        self.transactions += 1
        return super().transaction(actor)


@pytest.fixture
def counting(store: JobStore) -> CountingStore:
    return CountingStore(store.engine)


def register_in_chunks(store: JobStore, chunks: int, size: int) -> None:
    """``chunks`` registrations, one transaction each: their events' ``created_at`` ascend."""
    for c in range(chunks):
        store.register(new_jobs(size, prefix=f"c{c}-"), batch_key=BATCH, step="classify", max_attempts=3)


def created_at(store: JobStore) -> dict[str, Any]:
    """Each event's ``created_at`` by id (the events of one registration share it)."""
    with store.engine.connect() as conn:
        return {str(i): at for i, at in conn.execute(sa.text("SELECT event_id, created_at FROM triage.outbox"))}


def assert_oldest_first_each_once(store: JobStore, path: Path) -> None:
    ids = file_ids(path)
    at = created_at(store)
    assert len(ids) == len(set(ids)) == len(at)
    assert set(ids) == set(at)
    assert [at[i] for i in ids] == sorted(at.values())


def file_ids(path: Path) -> list[str]:
    return [str(parse_event(line).event_id) for line in path.read_bytes().splitlines()]


def scalar(store: JobStore, sql: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_stream_sends_oldest_first_with_one_transaction_a_batch(
    counting: CountingStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from triage.jobs.store import relay

    register_in_chunks(counting, 5, 9)  # 45 events, in batches of 10: 5 sends
    settled: list[int] = []

    def settle(transaction: Any, target: int, seconds: float) -> None:
        """Another test's transaction held the events back at the start: its polls and the
        claim's own transaction after them are not the stream's."""
        before = counting.transactions
        original(transaction, target, seconds)
        counting.transactions = before - 1
        settled.append(target)

    original = relay.settle
    monkeypatch.setattr(relay, "settle", settle)
    counting.transactions = 0
    path = tmp_path / "events.jsonl"
    sends: list[int] = []
    sink = JsonlEventSink(path)

    def publish(events: Sequence[WorkEvent]) -> None:
        sends.append(len(events))
        sink.publish(events)

    assert counting.relay_all(publish, limit=10) == 45
    assert sends == [10, 10, 10, 10, 5]
    assert_oldest_first_each_once(counting, path)  # across batches
    # The first claim, then one transaction a batch: its mark and the next claim together
    # (before: claim and mark apart, two a batch).
    assert counting.transactions == 1 + len(sends)
    assert (
        scalar(
            counting,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )
    assert scalar(counting, "SELECT count(*) FROM triage.outbox_claims") == 0


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_relay_killed_between_send_and_mark_loses_nothing_and_writes_nothing_twice(
    counting: CountingStore, store: JobStore, tmp_path: Path
) -> None:
    """Killed after the third batch is in the file and before its mark: the first two batches
    are marked, the third is held by a claim that runs out, and a restarted relay (a new sink,
    a new process) sends the rest. The third batch is offered again and the sink skips it (it
    is in the file's tail): every event once, in order."""
    register_in_chunks(counting, 4, 10)
    path = tmp_path / "events.jsonl"
    sink = JsonlEventSink(path)
    sent: list[int] = []

    def publish(events: Sequence[WorkEvent]) -> None:
        sink.publish(events)
        sent.append(len(events))
        counting.die = len(sent) == 3

    with pytest.raises(Killed):
        counting.relay_all(publish, limit=10, claim_seconds=0.5)
    assert (
        scalar(
            counting,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) <= (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 20
    )
    assert scalar(counting, "SELECT count(*) FROM triage.outbox_claims") == 1  # the dead relay's
    assert store.relay_all(JsonlEventSink(path).publish, limit=10) == 10  # the claim still holds its 10
    with store.engine.connect() as conn:  # let it run out
        conn.execute(sa.text("SELECT pg_sleep(0.6)"))
    assert store.relay_all(JsonlEventSink(path).publish, limit=10) == 10  # offered again, skipped by the sink
    assert len(file_ids(path)) == 40
    assert_oldest_first_each_once(store, path)
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_sink_that_fails_mid_stream_gives_its_batch_back_at_once(counting: CountingStore, tmp_path: Path) -> None:
    register_in_chunks(counting, 3, 10)
    path = tmp_path / "events.jsonl"
    sink = JsonlEventSink(path)
    calls = 0

    def flaky(events: Sequence[WorkEvent]) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise ConnectionError("sink down")
        sink.publish(events)

    with pytest.raises(ConnectionError):
        counting.relay_all(flaky, limit=10)
    assert (
        scalar(
            counting,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) <= (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 10
    )
    assert scalar(counting, "SELECT count(*) FROM triage.outbox_claims") == 0  # released, not left to run out
    assert counting.relay_all(sink.publish, limit=10) == 20
    assert_oldest_first_each_once(counting, path)


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_only_the_relays_own_transactions_skip_the_commit_flush(store: JobStore) -> None:
    """The claim lock turns ``synchronous_commit`` off for its transaction alone (a lost claim or
    mark is a resend, which at-least-once allows); the connection's next transaction flushes again."""
    from triage.jobs.sql.writes import outbox as O

    with store.engine.connect() as conn:
        conn.execute(sa.text("SET synchronous_commit = on"))  # as deployed (the test server runs without)
        conn.commit()
        with conn.begin():
            conn.execute(O.claim_lock())
            assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "off"
        with conn.begin():
            assert conn.execute(sa.text("SHOW synchronous_commit")).scalar() == "on"


@pytest.mark.parametrize("timezone", [pytest.param("UTC", id="utc"), pytest.param("Asia/Kolkata", id="other-zone")])
@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_the_events_the_database_builds_are_the_contract_byte_for_byte(
    store: JobStore, tmp_path: Path, timezone: str
) -> None:
    """The claim builds each event's JSON in the database; the line in the file is exactly what
    ``WorkEvent`` built from the rows' columns (the relay's way before) serialises to: an empty
    payload left out, a non-empty one kept, the time in UTC (``Z``) whatever the session's zone."""
    import json as jsonlib

    @sa.event.listens_for(store.engine, "connect")
    def _zone(dbapi_connection: Any, _: Any) -> None:  # every new connection of this engine
        dbapi_connection.execute(f"SET TIME ZONE '{timezone}'")

    store.engine.dispose()  # the pool's connections are made again, in the zone
    try:
        register_in_chunks(store, 1, 3)
        with store.engine.begin() as conn:  # a non-empty payload, as a review decision's event has
            conn.execute(
                sa.text(
                    "UPDATE triage.outbox SET payload = CAST(:p AS jsonb)"
                    " WHERE event_id = (SELECT event_id FROM triage.outbox LIMIT 1)"
                ),
                {"p": jsonlib.dumps({"resolution": "labelled", "label": "billing", "resolved_by": "ann"})},
            )
            columns = conn.execute(sa.text("SELECT * FROM triage.outbox")).all()  # the envelope is the row's
            assert conn.execute(
                sa.text(
                    "SELECT count(*) FROM triage.outbox o JOIN triage.jobs j ON j.id = o.job_id"
                    " WHERE (o.correlation_id, o.payload_ref) = (j.correlation_id, j.payload_ref)"
                )
            ).scalar() == len(columns)
        path = tmp_path / "events.jsonl"
        assert store.relay_all(JsonlEventSink(path).publish) == 3
    finally:
        sa.event.remove(store.engine, "connect", _zone)
    expected = {str(r.event_id): outbox_row_json(r) for r in columns}
    lines = path.read_bytes().splitlines()
    assert all(b'Z","correlation_id"' in line for line in lines)
    assert {str(parse_event(line).event_id): line for line in lines} == expected
    assert sum(b'"payload":{' in line for line in lines) == 1
    assert sum(b'"payload"' in line for line in lines) == 1


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_publish_all_claims_what_the_sink_takes_at_once(store: JobStore, tmp_path: Path) -> None:
    """The file takes 5,000 events an append; a webhook, one request an event, 1,000 a claim
    (its claim's 300 s must cover them); ``batch`` overrides either."""
    from triage.pipeline.publish import WebhookEventSink, publish_all

    assert (JsonlEventSink.batch_size, WebhookEventSink.batch_size) == (5000, 1000)
    register_in_chunks(store, 2, 10)
    sends: list[int] = []

    class Small(JsonlEventSink):
        batch_size = 7

        def publish(self, events: Any) -> None:
            sends.append(len(events))
            super().publish(events)

    assert publish_all(store, Small(tmp_path / "events.jsonl")) == 20
    assert sends == [7, 7, 6]


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_claim_reads_the_unsent_events_by_the_relay_order_index_whatever_the_statistics_say(
    store: JobStore, tmp_path: Path
) -> None:
    """The last ANALYZE saw few events, then a run's events came in bulk: the claim must still
    start at the watermark in ``outbox_relay_order_idx`` (each day partition's), never scan the
    outbox (the relay must not read history; ``bench relay`` times it with 300,000 before)."""
    import uuid

    from triage.jobs.sql.writes import outbox as O

    register_in_chunks(store, 1, 200)
    assert store.relay_all(JsonlEventSink(tmp_path / "events.jsonl").publish) == 200
    with store.engine.begin() as conn:
        conn.execute(sa.text("ANALYZE triage.outbox"))
    register_in_chunks(store, 4, 1000)
    settle_outbox(store)
    with store.engine.connect() as conn, conn.begin():
        cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]  # an open connection has its DBAPI one
        params = {"limit": 1000, "token": uuid.uuid4(), "lease_seconds": 60.0}
        compiled = O.claim_events().compile(dialect=store.engine.dialect)
        cursor.execute("EXPLAIN " + str(compiled), {**compiled.params, **params})
        plan = "\n".join(row[0] for row in cursor.fetchall())
        # The populated partition is read through its (txid, event_id) index; a Seq Scan only of
        # an empty one (the days ahead, estimated at one row).
        assert re.search(r"Index Scan (using|on) \w*txid_event_id_idx", plan), plan
        seq = re.findall(r"Seq Scan on outbox_(?:p\d+|legacy|default)\b[^\n]*rows=(\d+)", plan)
        assert all(int(rows) <= 1 for rows in seq), plan
        assert len(conn.execute(O.claim_events(), params).all()) == 1000
