"""Claim, classify and complete in one transaction (issue #29; ADR 0009): an in-process
classifier's chunk of queued jobs is picked ``FOR UPDATE SKIP LOCKED`` and settled in the same
transaction, no lease written in between.

Each guarantee on a real PostgreSQL: a job's row is moved once (``queued -> completed``) and its
log holds two rows; a SIGKILL mid-chunk leaves nothing of the chunk and spends no attempt; the
poison document that killed it is found by the leased path the retry takes; an outcome that needs
a lease rolls its chunk back and the leased path takes over; the new move is the app role's only.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from psycopg import errors

from tests.ledger.helpers import documents, new_jobs, register_documents
from triage.classifiers.base import ClassifyRequest, ModelOutput, TransientClassifierError
from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.drill import DrillSettings
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LedgerError
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.one_transaction import run_step_in_chunks, uses_chunks
from triage.pipeline.steps import RunSettings, WorkRemains, run_step
from triage.roles import ensure_worker_role, maintainer_url, reviewer_url, worker_url

ROOT = Path(__file__).resolve().parents[2]
BATCH = "chunks"


def rows(store: JobStore, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params).all()]


def log_shapes(store: JobStore) -> dict[tuple[tuple[str | None, str], ...], int]:
    """How many jobs have each sequence of (from, to) moves in ``job_events``."""
    found = rows(
        store,
        "SELECT array_agg(coalesce(from_status::text, '-') || '>' || to_status::text ORDER BY id)"
        " FROM triage.job_events GROUP BY job_id",
    )
    shapes: dict[tuple[tuple[str | None, str], ...], int] = {}
    for (moves,) in found:
        key = tuple((None if a == "-" else a, b) for a, b in (m.split(">") for m in moves))
        shapes[key] = shapes.get(key, 0) + 1
    return shapes


@pytest.mark.own_database  # the chunks commit and roll back from lanes of their own (threads, connections)
def test_a_chunk_moves_each_job_once_and_logs_it_twice(store: JobStore, payloads: PayloadStore) -> None:
    """Before issue #29 each job was moved twice after its registration (queued -> running ->
    completed): three jobs rows written in its life and three log rows. Now two of each."""
    classifier = KeywordClassifier(Taxonomy.load())
    register_documents(store, payloads, documents(30), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0))
    try:
        report = run_step_in_chunks(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try1", batch_size=8))
    finally:
        handler.close()
    assert report.claimed == 30
    assert report.outcomes == {"Complete": 30}
    assert rows(store, "SELECT status::text, attempt, lease_owner, count(*) FROM triage.jobs GROUP BY 1, 2, 3") == [
        ("completed", 1, None, 30)
    ]
    assert log_shapes(store) == {((None, "queued"), ("queued", "completed")): 30}
    # The mover is named though no lease owner is; its attempt is the one it counted.
    assert rows(store, "SELECT DISTINCT actor, attempt FROM triage.job_events WHERE to_status = 'completed'") == [
        ("w/try1", 1)
    ]
    # Output, label and event with it: one classification at that attempt, one completion event.
    assert rows(store, "SELECT count(*), count(DISTINCT job_id), min(attempt) FROM triage.classifications") == [
        (30, 30, 1)
    ]
    assert rows(store, "SELECT count(*) FROM triage.document_labels") == [(30,)]
    assert rows(store, "SELECT event_type, count(*) FROM triage.outbox GROUP BY 1 ORDER BY 1") == [
        ("job.completed", 30),
        ("job.registered", 30),
    ]


@pytest.mark.own_database  # the chunks commit and roll back from lanes of their own (threads, connections)
def test_a_doubtful_answer_goes_to_review_from_its_chunk(store: JobStore, payloads: PayloadStore) -> None:
    classifier = KeywordClassifier(Taxonomy.load())
    register_documents(store, payloads, documents(5), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(1.0))  # no keyword match is that sure
    try:
        run_step_in_chunks(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try1"))
    finally:
        handler.close()
    assert log_shapes(store) == {((None, "queued"), ("queued", "manual_review")): 5}
    assert rows(store, "SELECT reason, attempts, count(*) FROM triage.manual_review GROUP BY 1, 2") == [
        ("inconclusive", 1, 5)
    ]
    assert rows(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.needs_review'") == [(5,)]


class FailsOn:
    """The keyword classifier, but one document's call fails transiently (a retry needs a lease)."""

    def __init__(self, external_id: str) -> None:
        self.inner, self.external_id = KeywordClassifier(Taxonomy.load()), external_id
        self.version = self.inner.version

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        if request.external_id == self.external_id:
            raise TransientClassifierError("server_error", "HTTP 503")
        return self.inner.classify(request)

    def close(self) -> None:
        self.inner.close()


@pytest.mark.own_database  # the chunks commit and roll back from lanes of their own (threads, connections)
def test_an_outcome_that_needs_a_lease_rolls_its_chunk_back_and_the_leased_path_takes_over(
    store: JobStore, payloads: PayloadStore
) -> None:
    classifier = FailsOn("T-003")
    register_documents(store, payloads, documents(10), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0))
    settings = RunSettings(owner="w/try1", batch_size=4, retry_soon_seconds=0.0)
    try:
        with pytest.raises(WorkRemains) as stopped:
            run_step_in_chunks(store, handler, batch_key=BATCH, settings=settings)
    finally:
        handler.close()
    report = stopped.value.report  # type: ignore[attr-defined]
    assert report.outcomes["RetryLater"] == 1
    assert report.outcomes["Complete"] == 9
    # The failing job's attempt was counted once, by its leased claim: its chunk left nothing.
    assert rows(store, "SELECT status::text, attempt FROM triage.jobs WHERE external_id = 'T-003'") == [
        ("retryable_failed", 1)
    ]
    shapes = log_shapes(store)
    assert shapes[((None, "queued"), ("queued", "running"), ("running", "retryable_failed"))] == 1
    leased = shapes.get(((None, "queued"), ("queued", "running"), ("running", "completed")), 0)
    in_chunks = shapes.get(((None, "queued"), ("queued", "completed")), 0)
    assert leased >= 3  # the rolled-back chunk's jobs (and the rest) went leased
    assert leased + in_chunks == 9
    assert rows(store, "SELECT count(*), count(DISTINCT job_id), max(attempt) FROM triage.classifications") == [
        (9, 9, 1)
    ]


def run_worker(db_url: DatabaseUrl, kill_on: str, *extra: str) -> int:
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": db_url.libpq(),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
    }
    argv = [sys.executable, "-m", "tests.ledger.poison_worker", BATCH, kill_on, *extra]
    return subprocess.run(argv, cwd=ROOT, env=env, timeout=120, check=False).returncode


def test_a_sigkill_mid_chunk_rolls_the_chunk_back_and_the_retry_isolates_the_poison(
    store: JobStore, db_url: DatabaseUrl
) -> None:
    n, chunk, poison = 200, 50, "doc-137"
    store.register(new_jobs(n), batch_key=BATCH, step="classify", max_attempts=3)

    assert run_worker(db_url, poison, "--in-chunks", "--limit", str(chunk)) == -signal.SIGKILL
    # The chunks committed before the kill are done; the killed one left nothing: its jobs are
    # queued at attempt 0 (no attempt spent), unlocked, with their registration alone in the log.
    done = rows(store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'")[0][0]
    assert done % chunk == 0
    assert done < n
    assert rows(
        store, "SELECT status::text, attempt, count(*) FROM triage.jobs WHERE status <> 'completed' GROUP BY 1, 2"
    ) == [("queued", 0, n - done)]
    assert rows(store, "SELECT status::text FROM triage.jobs WHERE external_id = :p", p=poison) == [("queued",)]
    assert rows(
        store,
        "SELECT count(*) FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
        " WHERE j.status = 'queued' AND e.to_status <> 'queued'",
    ) == [(0,)]
    assert rows(store, "SELECT count(*) FROM triage.document_labels") == [(done,)]

    # The task's retry takes the leased path (uses_chunks: a first try only), whose attempts and
    # poison isolation bound the deaths: the poison alone ends in review.
    assert not uses_chunks("keyword", try_number=2, separate_persist=False, drill=None)
    deaths = 0
    while (code := run_worker(db_url, poison)) != 0:
        assert code == -signal.SIGKILL, f"the worker failed otherwise: exit {code}"
        deaths += 1
        assert deaths <= 12, "the leased path did not isolate the poison"
        with store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")
            )
        store.release_expired_leases()
    assert rows(store, "SELECT status::text, count(*) FROM triage.jobs GROUP BY 1 ORDER BY 1") == [
        ("completed", n - 1),
        ("manual_review", 1),
    ]
    assert rows(
        store, "SELECT j.external_id, r.reason FROM triage.jobs j JOIN triage.manual_review r ON r.job_id = j.id"
    ) == [(poison, "poison")]


@pytest.mark.parametrize(
    ("classifier", "try_number", "separate", "drill", "expected"),
    [
        pytest.param("keyword", 1, False, None, True, id="keyword-first-try"),
        pytest.param("learned", 1, False, None, True, id="learned-first-try"),
        pytest.param("keyword", 2, False, None, False, id="a-retry-is-leased"),
        pytest.param("llm", 1, False, None, False, id="llm-keeps-its-lease"),
        pytest.param("keyword", 1, True, None, False, id="separate-persist-advances"),
        pytest.param("keyword", 1, False, DrillSettings(kill_on="doc-1"), False, id="a-fault-drill-is-leased"),
        pytest.param("keyword", 1, False, DrillSettings(duplicate_rate=0.1), True, id="duplicates-only"),
    ],
)
def test_who_uses_chunks(
    classifier: str, try_number: int, separate: bool, drill: DrillSettings | None, expected: bool
) -> None:
    assert uses_chunks(classifier, try_number=try_number, separate_persist=separate, drill=drill) is expected
    assert not uses_chunks(classifier, try_number=try_number, separate_persist=separate, drill=drill, switched_off=True)


# -- the move is data, and the app role's -------------------------------------------------------


@pytest.fixture
def queued_job(store: JobStore) -> uuid.UUID:
    (job,) = new_jobs(1, prefix="role")
    store.register([job], batch_key=BATCH, step="classify", max_attempts=3)
    return rows(store, "SELECT id FROM triage.jobs")[0][0]


@pytest.fixture
def logins(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> dict[str, DatabaseUrl]:
    if not pg_server.is_socket:
        pytest.skip("the deployment logins have no password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    return {"worker": worker_url(db_url), "reviewer": reviewer_url(db_url), "maintainer": maintainer_url(db_url)}


COMPLETE_QUEUED = (
    "UPDATE triage.jobs SET status = 'completed', status_reason = 'completed', attempt = attempt + 1"
    " WHERE id = %(id)s AND status = 'queued'"
)


@pytest.mark.parametrize(
    ("login", "refusal"),
    [
        pytest.param(
            "reviewer",
            "from queued to completed: that move is role triage_app's",
            id="review-role-by-the-transition-roles",
        ),
        pytest.param("maintainer", "permission denied for table jobs", id="maintenance-role-by-its-grants"),
    ],
)
def test_only_the_app_role_completes_a_queued_job(
    logins: dict[str, DatabaseUrl], queued_job: uuid.UUID, store: JobStore, login: str, refusal: str
) -> None:
    with (
        psycopg.connect(logins[login].libpq(), autocommit=True) as conn,
        pytest.raises(errors.InsufficientPrivilege, match=refusal),
    ):
        conn.execute(COMPLETE_QUEUED, {"id": queued_job})
    assert rows(store, "SELECT status::text FROM triage.jobs") == [("queued",)]
    with psycopg.connect(logins["worker"].libpq(), autocommit=True) as conn:
        conn.execute(COMPLETE_QUEUED, {"id": queued_job})
    assert rows(store, "SELECT status::text, attempt FROM triage.jobs") == [("completed", 1)]


def test_a_completed_job_is_never_queued_again_by_the_app_role(
    logins: dict[str, DatabaseUrl], queued_job: uuid.UUID, store: JobStore
) -> None:
    """The new move is one way: ``completed -> queued`` stays a move no role may make."""
    with psycopg.connect(logins["worker"].libpq(), autocommit=True) as conn:
        conn.execute(COMPLETE_QUEUED, {"id": queued_job})
        with pytest.raises(errors.CheckViolation):
            conn.execute("UPDATE triage.jobs SET status = 'queued' WHERE id = %(id)s", {"id": queued_job})


@pytest.mark.own_database  # the chunks commit and roll back from lanes of their own (threads, connections)
def test_a_chunk_whose_handling_raises_is_rolled_back_and_fails_the_try(
    store: JobStore, payloads: PayloadStore
) -> None:
    """A bug (here: a threshold no answer can be checked against) is no outcome: the try fails
    with it, as in the leased path, the lanes stop, and every chunk in hand is rolled back."""
    classifier = KeywordClassifier(Taxonomy.load())
    register_documents(store, payloads, documents(12), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(1.5))
    try:
        with pytest.raises(ValueError, match="confidence_threshold"):
            run_step_in_chunks(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try1", batch_size=4))
    finally:
        handler.close()
    assert rows(store, "SELECT status::text, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == [("queued", 0, 12)]
    assert rows(store, "SELECT count(*) FROM triage.classifications") == [(0,)]


class FailsInTheSecondLane(ClassifyHandler):
    """A handler with a bug that only the second lane meets (its thread's name says which)."""

    def handle(self, jobs: Any, ownership: Any = None) -> list[Any]:
        if threading.current_thread().name.endswith("_1"):
            raise RuntimeError("a bug in the second lane")
        return super().handle(jobs, ownership)


@pytest.mark.own_database  # the chunks commit and roll back from lanes of their own (threads, connections)
def test_a_lane_that_raises_stops_the_other_lane_after_its_chunk(store: JobStore, payloads: PayloadStore) -> None:
    """The try fails with the bug of either lane as soon as that lane meets it, as the leased path
    fails at once: the other lane commits the chunk in hand and takes no other (before, the first
    lane went on over the whole batch, unaware, and the try failed only when the batch was done)."""
    classifier = KeywordClassifier(Taxonomy.load())
    n, size = 400, 4
    register_documents(store, payloads, documents(n), classifier.version, batch_key=BATCH)
    handler = FailsInTheSecondLane(classifier, payloads, ClassifySettings(0.0))
    try:
        with pytest.raises(RuntimeError, match="second lane"):
            run_step_in_chunks(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try1", batch_size=size))
    finally:
        handler.close()
    completed, queued = rows(
        store,
        "SELECT count(*) FILTER (WHERE status = 'completed'), count(*) FILTER (WHERE status = 'queued')"
        " FROM triage.jobs",
    )[0]
    assert completed + queued == n  # nothing claimed, nothing half-committed
    assert completed % size == 0
    assert completed < n // 2, f"the first lane went on after the second raised: {completed} of {n} completed"


@pytest.mark.own_database  # PostgreSQL ends the hung chunk's session: a connection of its own
def test_a_hung_chunk_gives_its_jobs_back_after_the_lease_time(store: JobStore, payloads: PayloadStore) -> None:
    """A chunk's transaction is its lease, and must end as a lease does. A worker that hangs with
    a chunk open (or whose host vanished: no FIN reaches PostgreSQL, whose TCP keepalive notices
    after hours by default) held the chunk's row locks for as long: every claim, Airflow's retry
    too, skipped the jobs, and no lease ran out for reconciliation to take them back. Now the
    server ends a chunk's transaction once it has been idle for ``lease_seconds``."""
    classifier = KeywordClassifier(Taxonomy.load())
    register_documents(store, payloads, documents(6), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0))
    picked, resume = threading.Event(), threading.Event()
    hung: dict[str, Any] = {}

    def hang(jobs: Any) -> list[Any]:
        picked.set()
        resume.wait(30)
        return handler.handle(jobs)

    def chunk() -> None:
        try:
            hung["chunk"] = store.chunks.settle(
                batch_key=BATCH,
                step="classify",
                classifier_version=classifier.version,
                limit=6,
                actor="w/try1",
                decide=hang,
                lease_seconds=1.0,
            )
        except (LedgerError, sa.exc.SQLAlchemyError) as exc:
            hung["error"] = exc

    worker = threading.Thread(target=chunk)
    worker.start()
    try:
        assert picked.wait(10)
        time.sleep(2.5)  # the hung chunk's lease time is over
        retry = run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try2", lease_seconds=60))
    finally:
        resume.set()
        worker.join()
        handler.close()
    assert retry.claimed == 6
    assert "error" in hung  # the hung worker learns that its chunk is gone: nothing of it is written
    assert rows(store, "SELECT status::text, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == [("completed", 1, 6)]
    assert log_shapes(store) == {((None, "queued"), ("queued", "running"), ("running", "completed")): 6}
