"""The outbox relay alone (issue #16, item 1): events per second through the JSON-lines sink, and
its cost with a long history against a fresh outbox (the relay must not read history).

Two rounds on one scratch database and one events file: ``RELAY_N`` jobs registered (one
``job.registered`` event each) and relayed with :func:`triage.pipeline.publish.publish_all` as
``publish_events`` runs it; then ``HISTORY_ROUNDS`` more rounds of the same size registered and
relayed, so the last round starts with that many published events in the outbox and lines in
the file. The figure is the last round's seconds against the first's (goal: about 1, not
growing with history); the details split each round into the sink's time (serialising,
writing, fsync) and the database's (claims and marks), in wall-clock and client CPU seconds.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Figure, scratch_database, server_cpu_seconds
from tests.ledger.helpers import new_jobs
from triage.database import create_engine
from triage.jobs.store import JobStore
from triage.pipeline.publish import JsonlEventSink, publish_all

RELAY_N = int(os.environ.get("BENCH_RELAY_EVENTS", "100000"))
HISTORY_ROUNDS = 3
CHUNK = 5_000
BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


class TimedSink(JsonlEventSink):
    """The JSON-lines sink, counting the seconds spent in it."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.seconds = 0.0

    def publish(self, events: Any) -> None:
        start = time.perf_counter()
        try:
            super().publish(events)
        finally:
            self.seconds += time.perf_counter() - start


def _register(store: JobStore, n: int, prefix: str) -> None:
    for start in range(0, n, CHUNK):
        store.register(
            new_jobs(min(CHUNK, n - start), prefix=f"{prefix}-{start}-"),
            batch_key=BATCH,
            step="classify",
            max_attempts=3,
        )


def _round(store: JobStore, path: Path, n: int, prefix: str) -> dict[str, float]:
    _register(store, n, prefix)
    sink = TimedSink(path)
    server = server_cpu_seconds()
    cpu, start = time.process_time(), time.perf_counter()
    sent = publish_all(store, sink)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    server_after = server_cpu_seconds()
    assert sent == n, (sent, n)
    return {
        "seconds": round(seconds, 3),
        "events_per_second": round(n / seconds),
        "sink_seconds": round(sink.seconds, 3),
        "database_seconds": round(seconds - sink.seconds, 3),
        "client_cpu": round(cpu, 3),
        "server_cpu": round(server_after - server, 3) if server is not None and server_after is not None else -1.0,
        "bytes_read": sink.bytes_read,
    }


def run() -> list[Figure]:
    with scratch_database() as url, tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(url, pool_size=2)
        store, path = JobStore(engine), Path(tmp) / "events.jsonl"
        try:
            rounds = [_round(store, path, RELAY_N, f"r{i}") for i in range(HISTORY_ROUNDS + 1)]
        finally:
            engine.dispose()
    first, last = rounds[0], rounds[-1]
    return [
        Figure(
            f"relay, {RELAY_N // 1000}k events to JSON lines",
            "events/s",
            first["events_per_second"],
            "target: 2 events a doc at 5,000 docs/s, 20%",
            50_000.0,
            target_ratio=1.0,
            details={"round": first},
        ),
        Figure(
            f"relay with {HISTORY_ROUNDS * RELAY_N // 1000}k published before",
            "seconds",
            last["seconds"],
            "the same relay with no history",
            first["seconds"],
            target_ratio=1.2,
            higher_is_better=False,
            details={"rounds": rounds},
        ),
    ]
