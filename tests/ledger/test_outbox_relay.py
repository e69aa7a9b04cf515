"""The outbox relay under concurrency and slow sinks, on a real PostgreSQL and real files.

Two relays at once lose nothing and send nothing twice; the JSON-lines sink never reads the
file's history; a relay holds no transaction while a webhook is called, and a relay that died
mid-send leaves events that another relay sends once its claim runs out.
"""

from __future__ import annotations

import fcntl
import json
import os
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs, settle_outbox
from triage import migrations
from triage.contracts.events import WorkEvent, parse_event
from triage.database import DatabaseUrl, create_engine
from triage.jobs.sql.writes import outbox as O
from triage.jobs.store import JobStore
from triage.pipeline import publish as P
from triage.pipeline.publish import JsonlEventSink, WebhookEventSink, publish_all

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def register(store: JobStore, n: int, prefix: str = "doc") -> None:
    for start in range(0, n, 5000):
        store.register(
            new_jobs(min(5000, n - start), prefix=f"{prefix}{start}"), batch_key=BATCH, step="classify", max_attempts=3
        )


def scalar(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def outbox_ids(store: JobStore) -> set[str]:
    with store.engine.connect() as conn:
        return {str(i) for i in conn.execute(sa.text("SELECT event_id FROM triage.outbox")).scalars()}


def file_ids(path: Path) -> list[str]:
    """The event id of every line; a line that is not a whole event fails the test."""
    return [str(parse_event(line).event_id) for line in path.read_bytes().splitlines()]


# -- item 8: two relays, one JSON-lines file -------------------------------------------------


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_two_relays_at_once_append_every_event_once(store: JobStore, tmp_path: Path) -> None:
    """Two relays (threads, each its own sink, as two processes would be) publish 24,000
    events into one file at once, in small batches so that their appends interleave. Before
    the file lock, one relay's torn-tail repair cut lines the other was appending, and those
    events were marked published: lost."""
    register(store, 24_000)
    path = tmp_path / "events.jsonl"
    barrier = threading.Barrier(2)
    sent: list[int] = []
    errors: list[BaseException] = []

    def relay() -> None:
        sink = JsonlEventSink(path)
        barrier.wait()
        try:
            sent.append(publish_all(store, sink, batch=100))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=relay) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(sent) == 24_000
    assert min(sent) > 0  # both relays took part
    ids = file_ids(path)
    assert set(ids) == outbox_ids(store)  # nothing lost ...
    assert len(ids) == len(set(ids)) == 24_000  # ... and, with no crash, nothing twice
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_relay_never_cuts_a_line_another_relay_is_appending(store: JobStore, tmp_path: Path) -> None:
    """Deterministic: another relay is mid-append (under the sink's lock, half its line
    written) when this relay publishes. This relay waits for the lock; before the lock, its
    torn-tail repair cut the other's half line, whose event was then marked published: lost."""
    register(store, 10)
    path = tmp_path / "events.jsonl"
    theirs = _event(0)
    line = theirs.to_json() + b"\n"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the other relay's sink, appending
    os.write(fd, line[:40])
    sent: list[int] = []
    ours = threading.Thread(target=lambda: sent.append(publish_all(store, JsonlEventSink(path))))
    ours.start()
    ours.join(timeout=1.0)
    os.write(fd, line[40:])
    os.fsync(fd)
    os.close(fd)  # releases the lock
    ours.join()
    assert sent == [10]
    assert sorted(file_ids(path)) == sorted(outbox_ids(store) | {str(theirs.event_id)})


def _event(i: int) -> WorkEvent:
    return WorkEvent(
        event_id=uuid.uuid4(),
        job_id=uuid.uuid4(),
        event_type="job.registered",
        attempt=0,
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
        correlation_id=f"c{i}",
        payload_ref=f"file:///p/{i}",
    )


def _bytes_read() -> int:
    """Bytes this process read through read(2) and friends so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


def test_publishing_never_reads_the_history_of_the_file(tmp_path: Path) -> None:
    """A 40 MB event log: publishing to it reads a bounded tail, whatever the file's size
    (before: the whole file on every new sink, 761 MB after a million jobs)."""
    path = tmp_path / "events.jsonl"
    line = _event(0).to_json() + b"\n"
    with path.open("wb") as handle:
        for _ in range(40_000_000 // len(line)):
            handle.write(line)
    history = path.stat().st_size
    batches = [[_event(b * 10 + i) for i in range(10)] for b in range(5)]
    sink = JsonlEventSink(path)
    before = _bytes_read()
    for batch in batches:
        sink.publish(batch)
    read = _bytes_read() - before
    assert read < 2 * P.TAIL_BYTES < history / 4
    assert sink.bytes_read <= P.TAIL_BYTES + len(batches)  # the tail once, then one byte per publish
    assert path.stat().st_size == history + sum(len(e.to_json()) + 1 for b in batches for e in b)


def test_an_offered_again_batch_is_skipped_from_the_tail_and_memory_stays_bounded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(P, "RECENT_IDS", 30)
    path = tmp_path / "events.jsonl"
    first = [_event(i) for i in range(20)]
    JsonlEventSink(path).publish(first)
    restarted = JsonlEventSink(path)  # a relay that wrote, died before marking, and was restarted
    restarted.publish([*first[10:], _event(99)])
    assert len(file_ids(path)) == len(set(file_ids(path))) == 21
    for i in range(5):
        restarted.publish([_event(100 + 10 * i + j) for j in range(10)])
    assert len(restarted._recent) == 30  # the oldest ids are forgotten


# -- item 15b: no transaction open while a webhook is called --------------------------------


class SlowHook:
    """A webhook on loopback that, while answering its first request, looks at the database
    from a connection of its own: open transactions, and whether the events being sent can be
    locked at once (NOWAIT) and are skipped by a second relay."""

    def __init__(self, store: JobStore, second: JobStore, tmp_path: Path) -> None:
        self.seen: dict[str, Any] = {}
        self.received: list[str] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not hook.received:
                    hook.look(store, second, tmp_path, body["event_id"])
                hook.received.append(body["event_id"])
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"

    def look(self, store: JobStore, second: JobStore, tmp_path: Path, event_id: str) -> None:
        with store.engine.connect() as conn:
            self.seen["open_transactions"] = conn.execute(
                sa.text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()"
                )
            ).scalar()
        try:
            with store.engine.begin() as conn:
                conn.execute(
                    sa.text("SELECT 1 FROM triage.outbox WHERE event_id = :e FOR UPDATE NOWAIT"), {"e": event_id}
                )
            self.seen["lockable"] = True
        except sa.exc.OperationalError:  # lock_not_available: the relay still holds the row
            self.seen["lockable"] = False
        # Bounded: before the fix the second relay waits on nothing (SKIP LOCKED) and sends 0 too.
        self.seen["second_relay_sent"] = publish_all(second, JsonlEventSink(tmp_path / "second.jsonl"))

    def __enter__(self) -> SlowHook:
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def second_store(db_url: DatabaseUrl) -> Iterator[JobStore]:
    """Another relay: an engine (a pool of connections) of its own."""
    other = create_engine(db_url, pool_size=2)
    yield JobStore(other)
    other.dispose()


def test_a_relay_holds_no_transaction_while_the_webhook_is_called(
    store: JobStore, second_store: JobStore, tmp_path: Path
) -> None:
    register(store, 20)
    with SlowHook(store, second_store, tmp_path) as hook:
        sink = WebhookEventSink(hook.url)
        try:
            assert publish_all(store, sink) == 20
        finally:
            sink.close()
    assert hook.seen == {"open_transactions": 0, "lockable": True, "second_relay_sent": 0}
    assert sorted(hook.received) == sorted(outbox_ids(store))
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_relay_that_died_mid_send_leaves_its_events_to_the_next_once_its_claim_runs_out(
    store: JobStore, tmp_path: Path
) -> None:
    register(store, 30)
    dead = uuid.uuid4()
    settle_outbox(store)
    with store.transaction(None) as conn:  # what the relay committed before it died sending
        conn.execute(O.claim_lock())
        claimed = conn.execute(O.claim_events(), {"limit": 20, "token": dead, "lease_seconds": 0.5}).all()
    assert len(claimed) == 20
    path = tmp_path / "events.jsonl"
    assert publish_all(store, JsonlEventSink(path)) == 10  # the claim still holds its 20
    with store.engine.connect() as conn:  # let the claim run out
        conn.execute(sa.text("SELECT pg_sleep(0.6)"))
    assert publish_all(store, JsonlEventSink(path)) == 20
    with store.transaction(None) as conn:  # the "dead" relay was only slow: its late mark is fenced
        assert conn.execute(O.mark_published(), {"claim_token": dead}).rowcount == 0
    ids = file_ids(path)
    assert sorted(ids) == sorted(outbox_ids(store))
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0


# -- the upgrade ---------------------------------------------------------------------------


def test_events_left_unsent_across_the_watermark_migration_are_relayed_after_it(
    fresh_database: DatabaseUrl, tmp_path: Path
) -> None:
    """3 of 7 events published, then down to 0025 (the watermark becomes ``published_at``) and
    up again (the 4 unsent get their envelope from their jobs and a position after the
    watermark): exactly those 4 are relayed, each a whole event."""
    migrations.upgrade(fresh_database)
    engine = create_engine(fresh_database, poolclass=sa.NullPool)
    try:
        store = JobStore(engine)
        register(store, 7)
        first = tmp_path / "first.jsonl"
        assert store.relay(JsonlEventSink(first).publish, limit=3) == 3
        migrations.downgrade(fresh_database, "0025")
        assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE published_at IS NULL") == 4
        migrations.upgrade(fresh_database)
        second = tmp_path / "second.jsonl"
        assert publish_all(store, JsonlEventSink(second)) == 4
        assert sorted(file_ids(first) + file_ids(second)) == sorted(outbox_ids(store))
    finally:
        engine.dispose()


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_file_that_does_not_end_in_an_event_line_is_refused_not_cut(store: JobStore, tmp_path: Path) -> None:
    """Pointed at a file that is not an event log (no newline in its last MiB), the sink
    refuses (an OSError: the relay gives its claim back, reconciliation reports the sink down)
    instead of cutting the file to nothing, as the torn-tail repair once would have."""
    register(store, 3)
    path = tmp_path / "not-an-event-log.bin"
    path.write_bytes(b"x" * (P.MAX_TORN_BYTES + 10))
    with pytest.raises(P.EventLogDamaged, match="does not end in an event line"):
        publish_all(store, JsonlEventSink(path))
    assert path.stat().st_size == P.MAX_TORN_BYTES + 10
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 3
    )
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0  # released at once
