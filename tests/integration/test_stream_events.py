"""``stream_events`` on a real PostgreSQL and a real events file: the relay that runs beside
``classify`` sends events as they are written, ends when the batch's jobs are done, and stops
by itself when nobody works on the batch, so ``publish_events`` after it is never held back.

Time is a fake clock: the stream's pause is where the test's "worker" moves jobs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tests.integration.helpers import new_jobs
from triage.contracts.events import parse_event
from triage.jobs.models import Complete
from triage.jobs.store import JobStore
from triage.pipeline.publish import JsonlEventSink, StreamSettings, stream_while_worked

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
SETTINGS = StreamSettings(idle_seconds=3.0, quiet_seconds=60.0, poll_seconds=0.5)


class FakeTime:
    """``clock`` and ``sleep`` of the stream; each pause runs ``during_pause`` first."""

    def __init__(self, during_pause: Callable[[], None] = lambda: None) -> None:
        self.now, self.pauses, self.during_pause = 0.0, 0, during_pause

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.pauses += 1
        self.during_pause()
        self.now += seconds


def stream(store: JobStore, path: Path, time: FakeTime) -> int:
    return stream_while_worked(store, JsonlEventSink(path), BATCH, SETTINGS, clock=time.clock, sleep=time.sleep)


def lines(path: Path) -> list[tuple[str, str]]:
    """(job id, event type) of each line, in the file's order."""
    events = [parse_event(line) for line in path.read_bytes().splitlines()]
    return [(str(e.job_id), e.event_type) for e in events]


def register(store: JobStore, n: int) -> None:
    store.register(new_jobs(n), batch_key=BATCH, step="classify", max_attempts=3)


def test_events_written_while_it_streams_go_out_in_order_and_it_ends_with_the_batch(
    store: JobStore, tmp_path: Path
) -> None:
    register(store, 50)
    claim = store.claim(batch_key=BATCH, step="classify", limit=50, lease_seconds=300, owner="classify/0")
    chunks = [claim.jobs[i : i + 10] for i in range(0, 50, 10)]

    def classify_a_chunk() -> None:  # a classify task recording 10 jobs between two looks
        if chunks:
            store.record(claim, [Complete(j.id, j.attempt) for j in chunks.pop(0)])

    time, path = FakeTime(classify_a_chunk), tmp_path / "events.jsonl"
    assert stream(store, path, time) == 100
    sent = lines(path)
    assert len(sent) == len(set(sent)) == 100
    # each job's registration before its completion, and the stream paused only while jobs ran
    for job_id, _ in sent[:50]:
        assert sent.index((job_id, "job.registered")) < sent.index((job_id, "job.completed"))
    assert time.pauses == 5


def test_a_batch_nobody_works_on_ends_it_after_its_idle_seconds(store: JobStore, tmp_path: Path) -> None:
    """Queued jobs and no job running (classify not started, or failed and waiting for its
    retry): the stream sends what there is and stops after ``idle_seconds`` without an event."""
    register(store, 10)
    time, path = FakeTime(), tmp_path / "events.jsonl"
    assert stream(store, path, time) == 10
    assert SETTINGS.idle_seconds <= time.now < SETTINGS.idle_seconds + 1.0
    assert [t for _, t in lines(path)] == ["job.registered"] * 10


def test_running_jobs_that_write_nothing_end_it_after_its_quiet_seconds(store: JobStore, tmp_path: Path) -> None:
    """A lease whose worker died counts as running until reconciliation returns it: the stream
    does not wait for that."""
    register(store, 5)
    store.claim(batch_key=BATCH, step="classify", limit=5, lease_seconds=300, owner="a-dead-worker")
    time, path = FakeTime(), tmp_path / "events.jsonl"
    assert stream(store, path, time) == 5
    assert SETTINGS.quiet_seconds <= time.now < SETTINGS.quiet_seconds + 1.0


def test_a_finished_batch_is_relayed_without_a_pause(store: JobStore, tmp_path: Path) -> None:
    register(store, 20)
    claim = store.claim(batch_key=BATCH, step="classify", limit=20, lease_seconds=300, owner="classify/0")
    store.record(claim, [Complete(j.id, j.attempt) for j in claim.jobs])
    time, path = FakeTime(), tmp_path / "events.jsonl"
    assert stream(store, path, time) == 40
    assert time.pauses == 0
    assert stream(store, path, time) == 0  # nothing left for publish_events or a second stream
