"""Publishing the outbox on a real PostgreSQL: exactly once into the JSON-lines sink, at least
once (with the event id as idempotency key) to a webhook, nothing marked sent that was not."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.contracts.events import WorkEvent, parse_event
from triage.jobs.store import JobStore
from triage.pipeline.publish import JsonlEventSink, WebhookEventSink, publish_all

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def register(store: JobStore, n: int, prefix: str = "doc") -> None:
    store.register(new_jobs(n, prefix=prefix), batch_key=BATCH, step="classify", max_attempts=3)


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def scalar(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def outbox_ids(store: JobStore) -> set[str]:
    return {str(r.event_id) for r in rows(store, "SELECT event_id FROM triage.outbox")}


def file_ids(path: Path) -> list[str]:
    """Event ids of the file's lines, every line parsed as an event (a line that is not one fails)."""
    return [str(parse_event(line).event_id) for line in path.read_bytes().splitlines()]


def unpublish_all(store: JobStore) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.outbox SET txid = pg_current_xact_id()::text::bigint"))


class Failing:
    def __init__(self) -> None:
        self.calls = 0

    def publish(self, events: Sequence[WorkEvent]) -> None:
        self.calls += 1
        raise ConnectionError("sink down")

    def close(self) -> None:
        pass


# -- JSON lines ---------------------------------------------------------------------------


@pytest.mark.parametrize("batch", [pytest.param(1000, id="one-batch"), pytest.param(3, id="small-batches")])
@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_jsonl_sink_writes_each_event_exactly_once(store: JobStore, tmp_path: Path, batch: int) -> None:
    register(store, 10)
    path = tmp_path / "events" / "out.jsonl"
    sink = JsonlEventSink(path)
    assert publish_all(store, sink, batch=batch) == 10
    assert publish_all(store, sink, batch=batch) == 0
    ids = file_ids(path)
    assert len(ids) == len(set(ids)) == 10
    assert set(ids) == outbox_ids(store)
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )
    events = [parse_event(line) for line in path.read_bytes().splitlines()]
    refs = {r.id: (r.correlation_id, r.payload_ref) for r in rows(store, "SELECT * FROM triage.jobs")}
    assert all((e.correlation_id, e.payload_ref) == refs[e.job_id] for e in events)
    assert {e.event_type for e in events} == {"job.registered"}

    register(store, 4, prefix="later")  # new events later go out once, after the old ones
    assert publish_all(store, JsonlEventSink(path), batch=batch) == 4
    ids = file_ids(path)
    assert len(ids) == len(set(ids)) == 14


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_jsonl_sink_writes_each_relayed_event_as_its_own_json(store: JobStore, tmp_path: Path) -> None:
    """The sink's bytes are the contract: one :meth:`WorkEvent.to_json` a line, in relay order,
    whatever the sink does to write a batch at once (byte-compared against the same events)."""
    register(store, 25)
    path = tmp_path / "out.jsonl"
    assert publish_all(store, JsonlEventSink(path), batch=10) == 25
    unpublish_all(store)  # the same events offered again, this time to a list
    events: list[WorkEvent] = []
    assert store.relay_all(events.extend, limit=10) == 25
    assert path.read_bytes() == b"".join(e.to_json() + b"\n" for e in events)


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_a_failing_sink_leaves_events_unsent_and_a_later_run_sends_them_once(store: JobStore, tmp_path: Path) -> None:
    register(store, 6)
    failing = Failing()
    with pytest.raises(ConnectionError):
        publish_all(store, failing)
    assert failing.calls == 1
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 6
    )
    path = tmp_path / "out.jsonl"
    assert publish_all(store, JsonlEventSink(path)) == 6
    assert publish_all(store, JsonlEventSink(path)) == 0
    ids = file_ids(path)
    assert sorted(ids) == sorted(outbox_ids(store))
    assert len(set(ids)) == len(ids)


@pytest.mark.parametrize("fresh_sink", [pytest.param(False, id="same-sink"), pytest.param(True, id="restarted")])
@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_jsonl_sink_skips_ids_already_written_after_a_crash_before_marking(
    store: JobStore, tmp_path: Path, fresh_sink: bool
) -> None:
    register(store, 5)
    path = tmp_path / "out.jsonl"
    sink = JsonlEventSink(path)
    publish_all(store, sink)
    before = path.read_bytes()
    unpublish_all(store)  # as if the process died after the write and before the commit
    register(store, 2, prefix="new")
    again = JsonlEventSink(path) if fresh_sink else sink
    assert publish_all(store, again) == 7  # all relayed and marked ...
    after = path.read_bytes()
    assert after.startswith(before)
    ids = file_ids(path)
    assert len(ids) == len(set(ids)) == 7  # ... but only the two new ones written
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_jsonl_sink_recovers_from_a_torn_last_line(store: JobStore, tmp_path: Path) -> None:
    """A crash in the middle of the write leaves a partial last line and nothing marked: the
    next run must still leave one parseable line per event."""
    register(store, 4)
    path = tmp_path / "out.jsonl"
    publish_all(store, JsonlEventSink(path))
    whole = path.read_bytes()
    torn = file_ids(path)[-1]
    path.write_bytes(whole[: len(whole) - 40])  # the last event torn mid-line, no newline
    with store.engine.begin() as conn:  # the commit that would have marked it never happened
        conn.execute(
            sa.text("UPDATE triage.outbox SET txid = pg_current_xact_id()::text::bigint WHERE event_id = :id"),
            {"id": torn},
        )
    assert publish_all(store, JsonlEventSink(path)) == 1
    good = []
    for line in path.read_bytes().splitlines():
        try:
            good.append(str(parse_event(line).event_id))
        except ValueError:
            continue
    assert sorted(set(good)) == sorted(outbox_ids(store))  # every event readable in the file
    assert len(good) == len(set(good))


# -- webhook ------------------------------------------------------------------------------


class Receiver:
    """A tiny webhook receiver on loopback; ``fail_on`` lists request numbers (1-based) to
    answer with 500."""

    def __init__(self, fail_on: Sequence[int] = ()) -> None:
        self.received: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.fail_on = set(fail_on)
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with receiver.lock:
                    receiver.received.append((dict(self.headers), body))
                    number = len(receiver.received)
                status = 500 if number in receiver.fail_on else 204
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host!s}:{port}/hooks/triage"

    def keys(self) -> list[str]:
        return [next(v for k, v in h.items() if k.lower() == "idempotency-key") for h, _ in self.received]


@pytest.fixture
def receiver() -> Iterator[Callable[..., Receiver]]:
    made: list[Receiver] = []

    def make(fail_on: Sequence[int] = ()) -> Receiver:
        r = Receiver(fail_on)
        r.thread.start()
        made.append(r)
        return r

    yield make
    for r in made:
        r.server.shutdown()
        r.server.server_close()


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_webhook_sends_the_event_id_as_idempotency_key(store: JobStore, receiver: Any) -> None:
    hook = receiver()
    register(store, 5)
    sink = WebhookEventSink(hook.url, headers={"Authorization": "Bearer hook-secret"})
    try:
        assert publish_all(store, sink) == 5
        assert publish_all(store, sink) == 0
    finally:
        sink.close()
    assert len(hook.received) == 5
    for headers, body in hook.received:
        key = next(v for k, v in headers.items() if k.lower() == "idempotency-key")
        assert key == body["event_id"]
        assert next(v for k, v in headers.items() if k.lower() == "authorization") == "Bearer hook-secret"
        assert parse_event(body).event_type == "job.registered"
    assert sorted(hook.keys()) == sorted(outbox_ids(store))


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_webhook_failure_marks_nothing_and_the_retry_repeats_keys(store: JobStore, receiver: Any) -> None:
    hook = receiver(fail_on=[3])
    register(store, 4)
    sink = WebhookEventSink(hook.url)
    try:
        with pytest.raises(httpx.HTTPStatusError):
            publish_all(store, sink)
        assert (
            scalar(
                store,
                "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
            )
            == 4
        )
        first_try = hook.keys()
        assert len(first_try) == 3
        assert publish_all(store, sink) == 4
    finally:
        sink.close()
    keys = hook.keys()
    # At least once: the two delivered before the failure arrive again, under the same keys,
    # so a receiver that honours Idempotency-Key applies each event once.
    assert set(keys) == outbox_ids(store)
    assert len(keys) == 3 + 4
    assert set(keys[3:]) == outbox_ids(store)
    assert (
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )
