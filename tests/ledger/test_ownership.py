"""Ownership to the end, on the real database: a worker that lost its lease acts on nothing
more, and SIGTERM drains a classify worker (the unstarted jobs go back at once, the one in
flight finishes within the grace or is given back, nothing is half-written)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from triage.adapters.http_actions import WebhookLabelAction
from triage.classifiers import Taxonomy, build_classifier
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClaimedJob, LabelWrite
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.persist import PersistHandler
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import OwnershipLost, RunSettings, run_step
from triage.sources.synthetic import SyntheticSource

ROOT = Path(__file__).resolve().parents[2]
DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = "ownership"
JOBS = 10


def register(store: JobStore, payloads: PayloadStore, n: int = JOBS) -> None:
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    retrieve(
        store,
        SyntheticSource(n, seed=5),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )


def classify(store: JobStore, payloads: PayloadStore, *, separate_persist: bool = False, owner: str = "w") -> None:
    handler = ClassifyHandler(
        build_classifier("keyword", taxonomy=Taxonomy.load()), payloads, ClassifySettings(0.0, 1, separate_persist)
    )
    try:
        run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner=owner, lease_seconds=60))
    finally:
        handler.close()


def rows(store: JobStore, sql: str) -> list[Any]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql)))


def statuses(store: JobStore) -> dict[str, str]:
    return {str(r.id): r.status for r in rows(store, "SELECT id, status::text FROM triage.jobs")}


class KeywordModel:
    """The keyword classifier with ``before(n)`` run before its n-th call; ``calls`` holds the
    job ids it was called for."""

    def __init__(self, before: Any) -> None:
        self.inner = build_classifier("keyword", taxonomy=Taxonomy.load())
        self.version, self.before, self.calls = self.inner.version, before, list[str]()

    def classify(self, request: Any) -> Any:
        self.calls.append(request.job_id)
        self.before(len(self.calls))
        return self.inner.classify(request)

    def close(self) -> None:
        self.inner.close()


def steal_the_leases(store: JobStore, thief: str) -> None:
    """What a lost lease looks like: it ran out, reconciliation took the jobs back, and another
    worker claimed them (in as many claims as poison isolation allows: the jobs of a claim taken
    back are suspects, claimed in halves)."""
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'")
        )
    store.release_expired_leases(batch_key=BATCH)
    while store.claim(batch_key=BATCH, step="persist", limit=100, lease_seconds=60, owner=thief).jobs:
        pass


# -- a lost lease: no external action -----------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_worker_that_lost_its_lease_sends_no_more_label_actions(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 5)
    classify(store, payloads, separate_persist=True)  # 5 jobs wait at persist
    with FakeProvider() as provider:
        sent = WebhookLabelAction(provider.url, timeout_s=5)

        def action(job: ClaimedJob, label: LabelWrite) -> None:
            sent(job, label)
            if sum(provider.requests.values()) == 1:  # the lease is lost right after the first action
                steal_the_leases(store, "w2")

        with pytest.raises(Exception) as stopped:  # noqa: PT011 - the side effect is asserted first
            run_step(store, PersistHandler(store, action), batch_key=BATCH, settings=RunSettings(owner="w1"))
        assert sum(provider.requests.values()) == 1, "no action after the lease was lost"
        assert isinstance(stopped.value, OwnershipLost)
        assert "lost at step persist" in str(stopped.value)
        held = rows(store, "SELECT lease_owner, count(*) FROM triage.jobs GROUP BY lease_owner")
        assert [tuple(r) for r in held] == [("w2", 5)], "nothing of w1's claim was recorded"

        # w2's lease runs out in turn; the next worker completes every job, one effect each.
        with store.engine.begin() as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second'"))
        store.release_expired_leases(batch_key=BATCH)
        run_step(store, PersistHandler(store, sent), batch_key=BATCH, settings=RunSettings(owner="w3"))
        sent.close()
        assert set(statuses(store).values()) == {"completed"}
        assert sum(provider.requests.values()) == 6  # the first job's key asked twice
        assert len(provider.requests) == 5
        assert len(provider.effects) == 5


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_classify_worker_that_lost_its_lease_calls_the_model_no_more(store: JobStore, tmp_path: Path) -> None:
    """The heartbeat hears the lease is lost; the next document's model call is not made."""
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 6)

    def lost_at_the_second(n: int) -> None:
        if n == 2:
            with store.engine.begin() as conn:
                conn.execute(
                    sa.text(
                        "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE status = 'running'"
                    )
                )
            store.release_expired_leases(batch_key=BATCH)
            time.sleep(1.5)  # the heartbeat (every lease/3 = 1 s) hears of it

    model = KeywordModel(lost_at_the_second)
    calls = model.calls
    handler = ClassifyHandler(model, payloads, ClassifySettings(0.0, 1))
    with pytest.raises(Exception) as stopped:  # noqa: PT011 - the side effect is asserted first
        run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="w1", lease_seconds=3))
    assert len(calls) == 2, "no model call after the lease was lost"
    assert isinstance(stopped.value, OwnershipLost)
    assert "4 jobs left alone" in str(stopped.value)
    assert set(statuses(store).values()) == {"retryable_failed"}, "taken back by reconciliation, untouched since"


# -- SIGTERM: the drain -------------------------------------------------------------------------


class Worker:
    """``tests.fakes.slow_worker`` in a process of its own; remembers the model calls it started."""

    def __init__(self, db_url: DatabaseUrl, payloads: Path, **options: float) -> None:
        args = [f"--{k.replace('_', '-')}={v}" for k, v in options.items()]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fakes.slow_worker", db_url.libpq(), str(payloads), BATCH, *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "plugins")},
        )
        self.calls: list[str] = []
        self.lines: list[str] = []
        self._started = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._started:
                self.lines.append(line.strip())
                if line.startswith("call "):
                    self.calls.append(line.split()[2])
                self._started.notify_all()

    def wait_for_call(self, n: int, timeout: float = 60) -> None:
        with self._started:
            assert self._started.wait_for(lambda: len(self.calls) >= n or self.proc.poll() is not None, timeout)
        assert len(self.calls) >= n, self.proc.stderr.read() if self.proc.stderr else ""

    def finish(self, timeout: float = 30) -> int:
        code = self.proc.wait(timeout)
        return code


def wait_until(check: Any, timeout: float) -> float:
    """Seconds until ``check()`` held; fails after ``timeout``."""
    began = time.monotonic()
    while not check():
        assert time.monotonic() - began < timeout, "not in time"
        time.sleep(0.02)
    return time.monotonic() - began


def assert_nothing_half_written(store: JobStore) -> None:
    """Every job completed (label, classification, one completion event) or queued with no lease,
    no label and its attempt given back."""
    jobs = rows(
        store,
        "SELECT j.id, j.status::text AS status, j.attempt, j.lease_owner, "
        "(SELECT count(*) FROM triage.document_labels l WHERE l.job_id = j.id) AS labels, "
        "(SELECT count(*) FROM triage.classifications c WHERE c.job_id = j.id) AS classifications, "
        "(SELECT count(*) FROM triage.outbox o WHERE o.job_id = j.id "
        " AND o.event_type = 'job.completed') AS events FROM triage.jobs j",
    )
    for job in jobs:
        if job.status == "completed":
            assert (job.labels, job.classifications, job.events, job.lease_owner) == (1, 1, 1, None), job
        else:
            assert job.status == "queued", job
            assert job.attempt == 0, "the attempt is given back"
            assert (job.labels, job.classifications, job.events, job.lease_owner) == (0, 0, 0, None), job


@pytest.mark.parametrize(
    ("options", "in_flight_ends"),
    [
        pytest.param({"fast": 1.0, "slow": 1.0, "grace": 3.0}, "completed", id="in-flight-finishes-within-grace"),
        pytest.param({"fast": 0.2, "slow": 5.0, "slow_from": 6, "grace": 0.5}, "queued", id="in-flight-abandoned"),
    ],
)
def test_sigterm_drains_a_classify_worker(
    store: JobStore, db_url: DatabaseUrl, tmp_path: Path, options: dict[str, float], in_flight_ends: str
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads)
    worker = Worker(db_url, tmp_path / "payloads", batch_size=4, **options)
    worker.wait_for_call(6)  # claim 1 (calls 1-4) recorded; claim 2: 5 done, 6 in flight, 7 and 8 unstarted
    worker.proc.send_signal(signal.SIGTERM)
    first, in_flight = worker.calls[:5], worker.calls[5]

    def unstarted_back() -> bool:
        now = statuses(store)
        return sum(1 for s in now.values() if s == "queued") == JOBS - 6 and now[in_flight] == "running"

    # The unstarted jobs are queued again at once, while the one in flight is still running:
    # nobody waits for the lease (60 s) to run out.
    assert wait_until(unstarted_back, timeout=0.9) < 0.9
    if in_flight_ends == "queued":  # past the grace, before the model answers: given back
        wait_until(lambda: statuses(store)[in_flight] == "queued", timeout=2.0)
        assert worker.proc.poll() is None, "given back while the process is still inside the model call"
    assert worker.finish() == 3, worker.lines
    assert any(line.startswith("drained") for line in worker.lines)

    now = statuses(store)
    assert {now[j] for j in first} == {"completed"}
    assert now[in_flight] == in_flight_ends
    assert sum(1 for s in now.values() if s == "completed") == 5 + (in_flight_ends == "completed")
    assert_nothing_half_written(store)

    classify(store, payloads, owner="second-run")  # a second run completes everything
    assert set(statuses(store).values()) == {"completed"}
    assert_nothing_half_written(store)
    burned = rows(store, "SELECT count(*) FROM triage.jobs WHERE attempt > 1")
    assert burned[0][0] == 0, "a drain spends no job's attempt"


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_execution_timeout_mid_batch_settles_the_claim(store: JobStore, tmp_path: Path) -> None:
    """Airflow's ``execution_timeout`` raises ``AirflowTaskTimeout`` (a BaseException) inside the
    model call: the documents already classified are recorded, the rest of the claim is given
    back at once (its attempts undone), not left running until the lease runs out."""
    from airflow.sdk.exceptions import AirflowTaskTimeout

    from triage.pipeline.ownership import Drain

    payloads = PayloadStore(tmp_path / "payloads")
    register(store, payloads, 6)

    def times_out_at_the_third(n: int) -> None:
        if n == 3:
            raise AirflowTaskTimeout("Timeout, PID: 1")

    model = KeywordModel(times_out_at_the_third)
    calls = model.calls
    handler = ClassifyHandler(model, payloads, ClassifySettings(0.0, 1))
    with pytest.raises(AirflowTaskTimeout):
        run_step(
            store,
            handler,
            batch_key=BATCH,
            settings=RunSettings(owner="w1", lease_seconds=60),
            drain=Drain(grace_seconds=0.2),
        )
    now = statuses(store)
    assert {now[j] for j in calls[:2]} == {"completed"}
    assert sorted(now.values()) == ["completed"] * 2 + ["queued"] * 4
    assert_nothing_half_written(store)
