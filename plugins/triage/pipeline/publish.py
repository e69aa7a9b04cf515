"""Publish events: relay unsent outbox events to a sink and mark them sent.

Delivery is at least once (a crash between sending and marking sends again), so every sink
receives the event id as its idempotency key: the JSON-lines sink skips ids it has written, and
the webhook sends ``Idempotency-Key`` for the receiver to refuse a duplicate.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from triage.contracts.events import WorkEvent
from triage.jobs.store import JobStore

log = logging.getLogger(__name__)


class EventSink(Protocol):
    def publish(self, events: Sequence[WorkEvent]) -> None:
        """Deliver ``events`` or raise; never deliver an event id twice to the same place."""
        ...

    def close(self) -> None:
        """Release what the sink holds (connections)."""
        ...


class JsonlEventSink:
    """Appends events to a JSON-lines file, one line per event id (fsynced before returning)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._seen: set[str] | None = None

    def _load_seen(self) -> set[str]:
        seen: set[str] = set()
        if self.path.exists():
            with self.path.open("rb") as handle:
                for line in handle:
                    try:
                        seen.add(json.loads(line)["event_id"])
                    except (ValueError, KeyError, TypeError):  # a torn last line from a crash
                        continue
        return seen

    def _cut_torn_tail(self) -> None:
        """A crash mid-write leaves a last line without its newline, whose events were never
        marked published: cut it off so they are written again, each on a line of its own."""
        if not self.path.exists():
            return
        with self.path.open("rb+") as handle:
            size = handle.seek(0, os.SEEK_END)
            if size == 0:
                return
            handle.seek(size - 1)
            if handle.read(1) == b"\n":
                return
            position = size
            while position > 0:
                step = min(65536, position)
                handle.seek(position - step)
                chunk = handle.read(step)
                newline = chunk.rfind(b"\n")
                if newline >= 0:
                    handle.truncate(position - step + newline + 1)
                    return
                position -= step
            handle.truncate(0)

    def publish(self, events: Sequence[WorkEvent]) -> None:
        if self._seen is None:
            self._seen = self._load_seen()
        fresh = [e for e in events if str(e.event_id) not in self._seen]
        if not fresh:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._cut_torn_tail()
        with self.path.open("ab") as handle:
            handle.write(b"".join(e.model_dump_json().encode() + b"\n" for e in fresh))
            handle.flush()
            os.fsync(handle.fileno())
        self._seen.update(str(e.event_id) for e in fresh)

    def close(self) -> None:
        """Nothing to release: every publish opens and fsyncs the file itself."""


class WebhookEventSink:
    """POSTs each event as JSON with ``Idempotency-Key: <event_id>``; any non-2xx raises."""

    def __init__(self, url: str, headers: dict[str, str] | None = None, timeout_s: float = 10.0) -> None:
        import httpx

        self.url = url
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})

    def publish(self, events: Sequence[WorkEvent]) -> None:
        for event in events:
            response = self._client.post(self.url, content=event.model_dump_json(),
                                         headers={"Idempotency-Key": str(event.event_id),
                                                  "Content-Type": "application/json"})  # fmt: skip
            response.raise_for_status()

    def close(self) -> None:
        self._client.close()


def publish_all(store: JobStore, sink: EventSink, *, batch: int = 1000) -> int:
    """Relay every unsent event; returns how many were sent."""
    sent = 0
    while True:
        n = store.relay(sink.publish, limit=batch)
        if n == 0:
            break
        sent += n
    log.info("published %d events", sent)
    return sent
