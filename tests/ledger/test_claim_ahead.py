"""The window of model calls across claims (``RunSettings.claim_ahead``, the classify step of the
llm classifier), on the real database: the next claim is taken only once the current one has one
round of calls left to start (so a second worker still finds the rest of the day), its calls
then run beside that round but never beyond the handler's concurrency, every job is classified
once, the claim taken ahead keeps its lease while its jobs wait, and whatever stops the step (a
drain, a timeout, an outage) gives its jobs back, records what finished or parks them: nothing
is left ``running``."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.test_ownership import BATCH, register, rows
from triage.classifiers import Taxonomy, build_classifier
from triage.classifiers.base import TransientClassifierError
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.ownership import Drain
from triage.pipeline.steps import CircuitOpen, Drained, RunSettings, run_step

# Claims, model calls and heartbeats overlap in threads, and leases run out in time.
pytestmark = pytest.mark.own_database


class Model:
    """The keyword classifier with ``before(n)`` run before its n-th call (n counted under a
    lock: calls run on the handler's pool); ``most_in_flight`` is the most calls at once and
    ``spans`` each call's job id, start and end (monotonic)."""

    def __init__(self, before: Callable[[int], None]) -> None:
        self.inner = build_classifier("keyword", taxonomy=Taxonomy.load())
        self.version, self.before, self.calls = self.inner.version, before, list[str]()
        self._lock, self._in_flight, self.most_in_flight = threading.Lock(), 0, 0
        self.spans: list[tuple[str, float, float]] = []

    def classify(self, request: Any) -> Any:
        with self._lock:
            self.calls.append(request.job_id)
            n, self._in_flight = len(self.calls), self._in_flight + 1
            self.most_in_flight = max(self.most_in_flight, self._in_flight)
        started = time.monotonic()
        try:
            self.before(n)
            return self.inner.classify(request)
        finally:
            with self._lock:
                self._in_flight -= 1
                self.spans.append((request.job_id, started, time.monotonic()))

    def close(self) -> None:
        self.inner.close()


def run(
    store: JobStore,
    payloads: PayloadStore,
    model: Any,
    drain: Drain | None = None,
    concurrency: int = 2,
    **settings: Any,
) -> None:
    handler = ClassifyHandler(model, payloads, ClassifySettings(0.0, concurrency))
    try:
        run_step(
            store,
            handler,
            batch_key=BATCH,
            settings=RunSettings(**{"owner": "w", "batch_size": 4, "claim_ahead": True, **settings}),
            drain=drain or Drain(grace_seconds=0.5),
        )
    finally:
        handler.close()


def ledger(store: JobStore) -> list[tuple[str, int, str | None]]:
    return sorted(
        (r.status, r.attempt, r.status_reason)
        for r in rows(store, "SELECT status::text, attempt, status_reason FROM triage.jobs")
    )


def claims_per_job(store: JobStore) -> set[int]:
    with store.engine.connect() as conn:
        return set(
            conn.execute(
                sa.text("SELECT count(*) FILTER (WHERE to_status = 'running') FROM triage.job_events GROUP BY job_id")
            ).scalars()
        )


def claimed(store: JobStore) -> int:
    """Jobs claimed so far (running, or recorded since)."""
    return len(rows(store, "SELECT id FROM triage.jobs WHERE status <> 'queued'"))


@pytest.fixture
def timeout_at() -> Iterator[Callable[[float], object]]:
    """``timeout_at(s)``: Airflow's ``execution_timeout`` in ``s`` seconds, as Airflow raises it:
    ``AirflowTaskTimeout`` from a SIGALRM handler, on the main thread (the step runner's)."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    def timeout(signum: int, frame: object) -> None:
        raise AirflowTaskTimeout("Timeout, PID: 1")

    previous = signal.signal(signal.SIGALRM, timeout)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


def test_every_job_is_claimed_once_and_the_window_never_exceeds_the_concurrency(
    store: JobStore, tmp_path: Path
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 10)
    model = Model(lambda n: time.sleep(0.05))
    run(store, payloads, model)
    assert ledger(store) == [("completed", 1, "completed")] * 10
    assert len(model.calls) == len(set(model.calls)) == 10
    assert claims_per_job(store) == {1}
    assert model.most_in_flight == 2
    # Claims of 4, 4 and 2: a call of the second started before the first's last call ended.
    claim_of = {
        str(r.job_id): r.claim
        for r in rows(
            store,
            "SELECT job_id, dense_rank() OVER (ORDER BY at) AS claim FROM triage.job_events WHERE to_status = 'running'",
        )
    }
    assert sorted(claim_of.values()) == [1] * 4 + [2] * 4 + [3] * 2
    first_ended = max(end for job, _, end in model.spans if claim_of[job] == 1)
    assert min(start for job, start, _ in model.spans if claim_of[job] == 2) < first_ended


def test_the_next_claim_waits_for_the_last_round_so_another_worker_finds_the_rest(
    store: JobStore, tmp_path: Path
) -> None:
    """Claims of 6 at 2 calls in flight: while the first round runs only the first claim is held;
    the next is taken once 2 jobs (one round) are left to start, after the fourth call started
    (the claim taken at a claim's start, session 8, held 12 from the outset)."""
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 18)
    held: dict[int, int] = {}

    def look(n: int) -> None:
        time.sleep(0.15)
        if n == 1:  # the first round is in flight, four jobs of the claim left to start
            held[n] = claimed(store)
        time.sleep(0.05)

    run(store, payloads, Model(look), batch_size=6)
    assert held == {1: 6}
    assert ledger(store) == [("completed", 1, "completed")] * 18


def test_a_handler_without_a_pool_takes_no_claim_ahead(store: JobStore, tmp_path: Path) -> None:
    """One call at a time: a second claim handled meanwhile would call beside the first."""
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 8)
    held: list[int] = []
    model = Model(lambda n: held.append(claimed(store)))
    run(store, payloads, model, concurrency=1)
    assert held == [4] * 4 + [8] * 4  # the second claim taken once the first is handled
    assert ledger(store) == [("completed", 1, "completed")] * 8


def test_a_claim_taken_ahead_keeps_its_lease_while_its_jobs_wait(store: JobStore, tmp_path: Path) -> None:
    """Claims of two at two calls in flight: the second is taken as the first's two calls of 1.2 s
    start, and its jobs wait for them: 2.4 s under a 1.5 s lease, heartbeated meanwhile, so it is
    still ours when they start."""
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 4)
    run(store, payloads, Model(lambda n: time.sleep(1.2)), batch_size=2, lease_seconds=1.5)
    assert ledger(store) == [("completed", 1, "completed")] * 4
    assert claims_per_job(store) == {1}


def test_a_drain_gives_back_the_claim_taken_ahead(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 12)
    drain = Drain(grace_seconds=0.5)

    def drain_at_the_third_call(n: int) -> None:
        if n == 3:
            drain.request()
        time.sleep(0.1)

    with pytest.raises(Drained):
        run(store, payloads, Model(drain_at_the_third_call), drain=drain)
    states = ledger(store)
    assert "running" not in {status for status, _, _ in states}
    assert all(attempt == 0 for status, attempt, _ in states if status == "queued")
    # The second claim (taken as the first's last round started) went back unstarted; four never claimed.
    assert sum(1 for status, _, _ in states if status == "queued") >= 8
    assert sum(1 for _, _, reason in states if reason == "released") >= 4


def test_a_timeout_gives_back_both_claims_and_records_what_finished(
    store: JobStore, tmp_path: Path, timeout_at: Callable[[float], object]
) -> None:
    """``execution_timeout`` strikes the step runner's thread while the window holds two claims."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 12)

    def time_out_at_the_third_call(n: int) -> None:
        if n == 3:
            timeout_at(0.05)
        time.sleep(0.1)

    model = Model(time_out_at_the_third_call)
    with pytest.raises(AirflowTaskTimeout):
        run(store, payloads, model)
    states = ledger(store)
    assert "running" not in {status for status, _, _ in states}
    completed = [s for s in states if s[0] == "completed"]
    assert completed == [("completed", 1, "completed")] * len(completed)
    assert len(completed) <= len(model.calls) < 8  # the second claim's jobs were not all started
    assert all(attempt == 0 for status, attempt, _ in states if status == "queued")
    assert sum(1 for _, _, reason in states if reason == "released") >= 4  # the second claim, given back


def test_an_outage_parks_the_claim_taken_ahead_with_the_rest(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 12)

    def down(n: int) -> None:
        time.sleep(0.05)
        raise TransientClassifierError("connection_error", "refused")

    with pytest.raises(CircuitOpen):
        run(store, payloads, Model(down))
    assert {(status, attempt, reason) for status, attempt, reason in ledger(store)} == {("waiting", 0, "outage:model")}


def test_a_text_asked_in_a_claims_last_round_is_not_asked_again_by_the_next_claim(
    store: JobStore, tmp_path: Path
) -> None:
    """With the content cache: claims of 4 at 2 calls in flight, the fourth document's text
    repeated by the fifth. The second claim is handled while the first one's last round (its
    call for that text) runs, and waits for that answer instead of asking again."""
    from datetime import UTC, datetime

    from triage.contracts.documents import DocumentPayload
    from triage.pipeline.retrieve import to_new_jobs
    from triage.pipeline.reuse import ContentCache
    from triage.sources.base import SourceDocument

    payloads = PayloadStore(tmp_path / "payloads")
    model = Model(lambda n: time.sleep(0.3))
    bodies = ["invoice overdue", "refund please", "password reset", "the repeated text", "the repeated text"]
    for i, body in enumerate([*bodies, "shipping delay", "cancel my plan", "app crashes"]):
        payload = DocumentPayload(
            external_id=f"d{i}", subject="Ticket", body=body, received_at=datetime(2026, 11, 1, tzinfo=UTC)
        )
        store.register(  # one registration each: claims take them in this order
            to_new_jobs([SourceDocument("test", f"d{i}", payload.to_bytes())], payloads, model.version),
            batch_key=BATCH,
            step="classify",
            max_attempts=3,
        )
    handler = ClassifyHandler(model, payloads, ClassifySettings(0.0, 2), cache=ContentCache(store, model.version, 0.0))
    try:
        settings = RunSettings(owner="w", batch_size=4, claim_ahead=True)
        run_step(store, handler, batch_key=BATCH, settings=settings, drain=Drain(grace_seconds=0.5))
    finally:
        handler.close()
    external = {str(r.id): r.external_id for r in rows(store, "SELECT id, external_id FROM triage.jobs")}
    assert sorted(external[j] for j in model.calls) == ["d0", "d1", "d2", "d3", "d5", "d6", "d7"]  # not d4
    assert len(ledger(store)) == 8
    assert {status for status, _, _ in ledger(store)} <= {"completed", "manual_review"}
    reused = rows(store, "SELECT job_id, reused_job_id FROM triage.classifications WHERE reused_job_id IS NOT NULL")
    assert [(external[str(r.job_id)], external[str(r.reused_job_id)]) for r in reused] == [("d4", "d3")]
