"""The relay writes PostgreSQL's JSON through (issue #29): the claim returns each event as
``WorkEvent.to_json``'s exact bytes (:func:`triage.jobs.sql.writes.outbox.events_json`), the
sinks write them without building a model, and the outbox's CHECKs hold the envelope to the
contract where it is written (migration 0034).

Byte for byte on a real PostgreSQL, over generated events of every type: payloads of strings
(unicode, escapes, controls), integers, floats across a double's whole range and at the edges of
pydantic's positional notation, booleans and nulls, and times with and without microseconds,
read under a session whose TimeZone, DateStyle and ``extra_float_digits`` are not the defaults.
The reference is ``WorkEvent.to_json`` of a model built from the row's typed columns. Rows the
SQL does not reproduce (nested payloads, numbers beyond 1e±300) are the fallback, named exactly,
and serialised in Python to the same bytes.
"""

from __future__ import annotations

import json
import math
import random
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import outbox_row_json
from triage.contracts.events import EVENT_TYPES, WorkEvent
from triage.jobs.schema import outbox
from triage.jobs.sql.writes import outbox as O
from triage.jobs.store import JobStore
from triage.jobs.store.relay import RelayedEvents
from triage.pipeline.publish import JsonlEventSink, WebhookEventSink, publish_all

EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.5,
    0.1 + 0.2,
    1 / 3,
    2 / 3,
    123.0,
    1e-5,
    -1e-5,
    math.nextafter(1e-5, 0),
    math.nextafter(1e-5, 1),
    1.5e-5,
    9.99e-6,
    1e-6,
    1e-4,
    math.nextafter(1e-4, 0),
    1e15,
    1234567890123456.8,
    math.nextafter(1e16, 0),
    1e16,
    math.nextafter(1e16, 1e17),
    1.2345678901234568e16,
    1e17,
    1e22,
    1e-300 * 1.5,
    1e300 / 1.5,
    0.1234567890123456789,
    0.8666666666666667,
    0.9999999999999999,
]
OUT_OF_RANGE_FLOATS = [5e-324, 1e-310, -2e-305, 1.5e-298, 3e-297, 1.7976931348623157e308, -2.5e305]
"""Numbers at a double's ends: the SQL leaves the tiniest to the fallback (a cast to float8 could
fail); jsonb keeps the huge ones as integers."""

EDGE_STRINGS = [
    "",
    "plain",
    'quote " and \\ backslash },{"event_id":"',
    "controls \x01\x02\x07\x08\x09\x0a\x0b\x0c\x0d\x1b\x1f and DEL \x7f",
    "unicode facturação ✓ 日本語 🚀 \u2028\u2029 \ufeff",
    "</script><b>&amp;</b> / slash",
    " leading and trailing ",
    # What a separator looks like in jsonb's text, inside strings.
    'a": "b',
    'x, "y": 1.5, "z',
    "ends with a backslash \\",
    '\\"',
    '": ',
    ", ",
    "v1.2.3 and 0.5",
]


def _random_string(rng: random.Random) -> str:
    alphabet = [chr(c) for c in (*range(1, 0x80), 0xE9, 0x2028, 0x4E2D, 0x1F600, 0xFFFD, 0x10FFFF)]
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))


def _random_float(rng: random.Random) -> float:
    value = rng.choice(
        [
            rng.random(),
            round(rng.random(), rng.randint(0, 6)),
            rng.random() * 10 ** rng.randint(-299, 299),
            float(rng.randint(-(10**6), 10**6)),
            rng.uniform(-1e16, 1e16),
        ]
    )
    return -value if rng.random() < 0.2 else value


def _value(rng: random.Random) -> Any:
    kind = rng.randrange(8)
    if kind == 0:
        return rng.choice(EDGE_FLOATS)
    if kind == 1:
        return _random_float(rng)
    if kind == 2:
        return rng.choice([0, 1, -7, 2**31, -(2**63), 10**30])
    if kind == 3:
        return rng.choice(EDGE_STRINGS)
    if kind == 4:
        return _random_string(rng)
    if kind == 5:
        return rng.choice([True, False])
    if kind == 6:
        return None
    return rng.random()


def _payload(rng: random.Random, i: int) -> dict[str, Any]:
    shape = i % 10
    if shape == 0:
        return {}
    if shape == 1:  # job.completed's shape
        return {
            "label": rng.choice(["billing", "outage", "facturação"]),
            "confidence": _value(rng),
            "classifier_version": "kw-1",
        }
    if shape == 2:  # nested: the fallback
        return {"items": [1, {"b": None}, 0.5], "o": {"x": rng.random()}}
    if shape == 3:  # a number beyond 1e±300: the fallback
        return {"tiny": rng.choice(OUT_OF_RANGE_FLOATS)}
    keys = [rng.choice([*EDGE_STRINGS, _random_string(rng), "a", "bb", "reason"]) for _ in range(rng.randint(1, 6))]
    return {key: _value(rng) for key in keys}


def _time(rng: random.Random, i: int) -> datetime:
    base = datetime(2026, 12, 5, 12, 53, tzinfo=UTC)
    choices = [
        base + timedelta(microseconds=rng.randrange(10**6)),
        base,  # no microseconds
        base + timedelta(seconds=rng.randrange(10**6)),  # none either
        base + timedelta(microseconds=1),
        base + timedelta(microseconds=100_000),
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(999, 7, 1, 3, 4, 5, 60, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 500_000, tzinfo=UTC),
    ]
    return choices[i % len(choices)]


def _numeric_text(value: float) -> str:
    """How jsonb writes a float it was given as ``json.dumps`` writes it: positional, every digit."""
    return format(Decimal(repr(value)), "f")


def _falls_back(payload: dict[str, Any]) -> bool:
    """Whether the SQL leaves the event to Python: a nested value, or a float whose jsonb text has
    a fraction and more than 300 characters (a tiny one; a huge one is stored without a fraction,
    and read back by anyone as an integer)."""
    return any(
        isinstance(v, dict | list) or (isinstance(v, float) and "." in (t := _numeric_text(v)) and len(t) > 300)
        for v in payload.values()
    )


def _rows(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    types = sorted(EVENT_TYPES)
    return [
        {
            "event_id": uuid.UUID(int=rng.getrandbits(128), version=4),
            "job_id": uuid.UUID(int=rng.getrandbits(128), version=4),
            "event_type": types[i % len(types)],
            "attempt": rng.choice([0, 1, 2, 7]),
            "created_at": _time(rng, i),
            "correlation_id": rng.choice([*EDGE_STRINGS[1:], _random_string(rng) or "c"]),
            "payload_ref": rng.choice(["sha256:" + "a" * 64, "s3://bucket/key é", 'ref "quoted"']),
            "payload": json.dumps(_payload(rng, i)),
        }
        for i in range(n)
    ]


INSERT = sa.text(
    "INSERT INTO triage.outbox (event_id, job_id, event_type, schema_version, attempt, created_at,"
    " correlation_id, payload_ref, payload)"
    " VALUES (:event_id, :job_id, :event_type, 1, :attempt, :created_at, :correlation_id, :payload_ref,"
    " CAST(:payload AS jsonb))"
)


def _insert_product_floats(conn: sa.Connection, floats: list[float]) -> set[str]:
    """Payloads made as the product makes ``job.completed``'s (``jsonb_build_object`` over a
    float8); returns the ids of those the SQL leaves to Python."""
    fallback = set()
    for value in floats:
        event_id = conn.execute(
            sa.text(
                "INSERT INTO triage.outbox (job_id, event_type, schema_version, attempt, correlation_id, payload_ref,"
                " payload) VALUES (gen_random_uuid(), 'job.completed', 1, 1, 'c', 'p',"
                " jsonb_build_object('label', 'billing', 'confidence', CAST(:f AS float8), 'classifier_version', 'v'))"
                " RETURNING CAST(event_id AS text)"
            ),
            {"f": value},
        ).scalar_one()
        if _falls_back({"confidence": value}):
            fallback.add(event_id)
    return fallback


def _references(conn: sa.Connection, ids: list[str]) -> dict[str, bytes]:
    """``WorkEvent.to_json`` of each row, built from its typed columns (read in UTC)."""
    conn.execute(sa.text("SET LOCAL TimeZone = 'UTC'"))
    conn.execute(sa.text("SET LOCAL DateStyle = 'ISO, YMD'"))
    rows = conn.execute(sa.select(*O.EVENT_COLUMNS).where(sa.cast(outbox.c.event_id, sa.Text).in_(ids))).all()
    return {str(r.event_id): outbox_row_json(r) for r in rows}


def _claimed(conn: sa.Connection, ids: list[str]) -> list[str]:
    """The relay's SQL (:func:`~triage.jobs.sql.writes.outbox.events_json`) over the rows
    ``ids``, in a session set unlike the defaults; the claim lock pins what it needs."""
    conn.execute(sa.text("SET LOCAL TimeZone = 'America/St_Johns'"))
    conn.execute(sa.text("SET LOCAL DateStyle = 'SQL, DMY'"))
    conn.execute(sa.text("SET LOCAL extra_float_digits = 0"))  # 15 digits: the claim lock sets 1
    conn.execute(O.claim_lock())
    picked = sa.select(*O.EVENT_COLUMNS).where(sa.cast(outbox.c.event_id, sa.Text).in_(ids)).cte("picked")
    return list(conn.execute(O.events_json(picked)).scalars().all())


def test_the_claim_gives_each_event_as_work_event_to_json_byte_for_byte(ledger: sa.Connection) -> None:
    rows = _rows(3000, seed=29)
    ledger.execute(INSERT, rows)
    product_fallback = _insert_product_floats(ledger, [*EDGE_FLOATS, *(random.Random(7).random() for _ in range(200))])
    ids = [str(i) for i in ledger.execute(sa.select(sa.cast(outbox.c.event_id, sa.Text))).scalars()]

    claimed = _claimed(ledger, ids)
    references = _references(ledger, ids)

    assert len(claimed) == len(references) == len(ids) > 3200
    fallback = {str(r["event_id"]) for r in rows if _falls_back(json.loads(r["payload"]))} | product_fallback
    exact = {json.loads(t)["event_id"]: t for t in claimed if t.startswith(O.EXACT_START)}
    assert set(ids) - set(exact) == fallback  # exactly the rows the SQL leaves to Python
    assert 200 < len(fallback) < len(ids) // 4
    mismatched = [(text, references[i]) for i, text in exact.items() if text.encode() != references[i]]
    assert mismatched == []
    # What the sinks write: the exact rows as they are, the fallback serialised in Python.
    order = [json.loads(t)["event_id"] for t in claimed]
    event_ids, texts = RelayedEvents(claimed).lines()
    assert event_ids == order
    assert [t.encode() for t in texts] == [references[i] for i in order]
    assert [str(e.event_id) for e in RelayedEvents(claimed)] == order


def test_a_fraction_of_1e16_or_more_is_written_as_pydantic_writes_it(ledger: sa.Connection) -> None:
    """A payload number with a fraction at or above 1e16 (a numeric, a Decimal: never a Python
    float, whose JSON text is an integer there) parses to an integral double, which PostgreSQL's
    ``float8`` text writes with all of its digits (``2.4259396595948512e+16``) where pydantic writes
    the shortest that round-trip (``2.425939659594851e+16``): such a row is the fallback's, and
    the sinks write pydantic's bytes."""
    rng = random.Random(16)
    numbers = [f"{int(rng.random() * 10.0**e):d}.{rng.randint(1, 9)}" for e in (17, 18, 19, 20, 25) for _ in range(40)]
    numbers += ["24259396595948512.5", "-38685308531359664.25", "220107067552823620.75", "1e16"]
    rows = _rows(len(numbers), seed=16)
    for row, number in zip(rows, numbers, strict=True):
        row["payload"] = '{"v": ' + number + ', "label": "billing"}'
    ledger.execute(INSERT, rows)
    ids = [str(r["event_id"]) for r in rows]

    claimed = _claimed(ledger, ids)
    references = _references(ledger, ids)

    order = [json.loads(t)["event_id"] for t in claimed]
    _, texts = RelayedEvents(claimed).lines()
    mismatched = [(text, references[i]) for i, text in zip(order, texts, strict=True) if text.encode() != references[i]]
    assert mismatched == []
    assert any(b"e+16" in references[i] for i in ids)  # the range PostgreSQL writes differently


def test_a_fallback_row_that_is_no_event_fails_its_batch(ledger: sa.Connection) -> None:
    """An exact row's envelope was checked on insert; a fallback row is still validated."""
    rows = _rows(2, seed=1)
    ledger.execute(INSERT, rows)
    claimed = _claimed(ledger, [str(r["event_id"]) for r in rows])
    with pytest.raises(ValueError, match="validation error"):
        RelayedEvents(['{"event_id" : "x"}', claimed[1]]).lines()


@pytest.mark.parametrize(
    ("column", "value", "constraint"),
    [
        pytest.param("event_type", "job.exploded", "outbox_event_type_known_check", id="event-type"),
        pytest.param("schema_version", 2, "outbox_schema_version_supported_check", id="schema-version"),
        pytest.param("attempt", -1, "outbox_attempt_check", id="attempt"),
        pytest.param("correlation_id", "", "outbox_envelope_check", id="empty-correlation-id"),
        pytest.param("correlation_id", None, "outbox_envelope_check", id="no-correlation-id"),
        pytest.param("payload_ref", "", "outbox_envelope_check", id="empty-payload-ref"),
        pytest.param("payload_ref", None, "outbox_envelope_check", id="no-payload-ref"),
        pytest.param("payload", "[1]", "outbox_payload_object_check", id="payload-array"),
        pytest.param("payload", '"text"', "outbox_payload_object_check", id="payload-string"),
        pytest.param("created_at", "infinity", "outbox_occurred_at_check", id="infinite-time"),
        pytest.param("created_at", "10000-01-01 00:00:00+00", "outbox_occurred_at_check", id="year-10000"),
    ],
)
def test_the_outbox_refuses_an_envelope_work_event_would_refuse(
    ledger: sa.Connection, column: str, value: Any, constraint: str
) -> None:
    row: dict[str, Any] = {
        "event_type": "job.completed",
        "schema_version": 1,
        "attempt": 1,
        "correlation_id": "c",
        "payload_ref": "p",
        "payload": "{}",
        "created_at": "2026-12-05 12:00:00+00",
        column: value,
    }
    with pytest.raises(sa.exc.IntegrityError) as caught, ledger.begin_nested():
        ledger.execute(
            sa.text(
                "INSERT INTO triage.outbox (job_id, event_type, schema_version, attempt, correlation_id, payload_ref,"
                " payload, created_at) VALUES (gen_random_uuid(), :event_type, :schema_version, :attempt,"
                " :correlation_id, :payload_ref, CAST(:payload AS jsonb), CAST(:created_at AS timestamptz))"
            ),
            row,
        )
    assert isinstance(caught.value.orig, psycopg.Error)
    assert caught.value.orig.diag.constraint_name == constraint


class _Hook(BaseHTTPRequestHandler):
    bodies: list[tuple[str, bytes]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.bodies.append((self.headers["Idempotency-Key"], body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def hook() -> Iterator[tuple[str, list[tuple[str, bytes]]]]:
    bodies: list[tuple[str, bytes]] = []

    class Hook(_Hook):
        pass

    Hook.bodies = bodies
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/events", bodies
    server.shutdown()
    server.server_close()


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_the_sinks_write_the_relayed_bytes_through(
    store: JobStore, tmp_path: Path, hook: tuple[str, list[tuple[str, bytes]]]
) -> None:
    """End to end through the relay: the JSON-lines file and the webhook's bodies are each
    event's ``WorkEvent.to_json``, fallback rows included, each event once."""
    rows = _rows(400, seed=3)
    with store.engine.begin() as conn:
        conn.execute(INSERT, rows)
    path = tmp_path / "events.jsonl"
    assert publish_all(store, JsonlEventSink(path), batch=150) == len(rows)
    with store.engine.begin() as conn:
        references = _references(conn, [str(r["event_id"]) for r in rows])
    lines = path.read_bytes().split(b"\n")
    assert lines[-1] == b""
    assert sorted(lines[:-1]) == sorted(references.values())

    # The webhook posts the same bytes, one event a request (a second relay over the same rows).
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.outbox_watermark SET txid = 0, event_id = '00000000-0000-0000-0000-000000000000'")
        )
    sink = WebhookEventSink(hook[0])
    try:
        assert publish_all(store, sink, batch=150) == len(rows)
    finally:
        sink.close()
    assert dict(hook[1]) == references


def test_a_relayed_batch_offered_again_is_skipped_by_id(ledger: sa.Connection, tmp_path: Path) -> None:
    """The sink remembers relayed ids as text: a batch offered again writes nothing twice, and a
    list of models with the same ids is skipped too."""
    rows = _rows(30, seed=5)
    ledger.execute(INSERT, rows)
    claimed = _claimed(ledger, [str(r["event_id"]) for r in rows])
    path = tmp_path / "events.jsonl"
    sink = JsonlEventSink(path)
    sink.publish(RelayedEvents(claimed[:20]))
    sink.publish(RelayedEvents(claimed[10:]))  # 10 offered again
    sink.publish(list(RelayedEvents(claimed)))  # models, all offered again
    written = path.read_bytes().split(b"\n")[:-1]
    assert len(written) == 30
    assert sorted(json.loads(line)["event_id"] for line in written) == sorted(
        json.loads(t)["event_id"] for t in claimed
    )
    restarted = JsonlEventSink(path)  # a new process seeds its memory from the file's tail
    restarted.publish(RelayedEvents(claimed))
    assert len(path.read_bytes().split(b"\n")) - 1 == 30


def test_the_float_edges_are_exercised() -> None:
    """The generated set reaches both notations pydantic uses and integral floats (so the
    comparison above covers them), on this platform's doubles."""
    assert sys.float_info.max > 1e308
    samples = [WorkEvent.model_validate({"payload": {"x": f}, **_envelope()}).to_json() for f in EDGE_FLOATS]
    text = b" ".join(samples)
    assert b'"x":1e-6' in text
    assert b'"x":1e+16' in text
    assert b'"x":0.00001' in text
    assert b'"x":1000000000000000.0' in text


def _envelope() -> dict[str, Any]:
    return {
        "event_id": uuid.uuid4(),
        "job_id": uuid.uuid4(),
        "event_type": "job.completed",
        "attempt": 1,
        "occurred_at": datetime(2026, 12, 5, tzinfo=UTC),
        "correlation_id": "c",
        "payload_ref": "p",
    }
