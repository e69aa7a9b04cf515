"""The classify step (and persist) on a real PostgreSQL: every row of the outcome table in
:mod:`triage.pipeline.classify`, the circuit breaker, retries within a run, and the drill."""

from __future__ import annotations

import hashlib
import random
import threading
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from triage.classifiers import build_classifier
from triage.classifiers.base import (
    Classifier,
    ClassifyRequest,
    ModelOutput,
    PermanentClassifierError,
    TransientClassifierError,
)
from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload, canonical_json_bytes
from triage.contracts.drill import DrillSettings
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.models import Advance, NewJob
from triage.jobs.vocabulary.states import JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.persist import PersistHandler
from triage.pipeline.retrieve import idempotency_key, retrieve, to_new_jobs
from triage.pipeline.steps import CircuitOpen, DependencyMisconfigured, RunSettings, StepReport, WorkRemains, run_step
from triage.sources.base import SourceDocument
from triage.sources.synthetic import SyntheticSource

START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 11, 2, tzinfo=UTC)
BATCH = f"{START.isoformat()}/{END.isoformat()}"
FAST = RetryPolicy(base_seconds=0.01, cap_seconds=0.05)
TAXONOMY = Taxonomy.load()


# -- seams and helpers ------------------------------------------------------------------------


Script = Callable[[ClassifyRequest], ModelOutput]


class ScriptedClassifier:
    """A classifier behind the Protocol whose answer per call is chosen by the test: a seam
    at the classifier boundary, with the real handler, runner, store and database around it."""

    version = "scripted-v1"

    def __init__(self, script: Script) -> None:
        self.script = script
        self.calls: list[ClassifyRequest] = []
        self._lock = threading.Lock()
        self.closed = False

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        with self._lock:
            self.calls.append(request)
        return self.script(request)

    def close(self) -> None:
        self.closed = True


def ok(label: str = "billing", confidence: float = 0.9) -> ModelOutput:
    return ModelOutput(label=label, confidence=confidence, rejected_reason=None, latency_ms=1.5)


def transient(_request: ClassifyRequest) -> ModelOutput:
    raise TransientClassifierError("server_error", "HTTP 503")


def by_external_id(answers: dict[str, Script], default: Script | None = None) -> Script:
    def script(request: ClassifyRequest) -> ModelOutput:
        return answers.get(request.external_id, default or (lambda _r: ok()))(request)

    return script


def document(external_id: str, body: str = "Please help", subject: str = "Hello") -> bytes:
    return DocumentPayload(
        external_id=external_id, subject=subject, body=body, received_at=datetime(2026, 11, 1, 9, tzinfo=UTC)
    ).to_bytes()


def register(
    store: JobStore,
    payloads: PayloadStore,
    docs: dict[str, bytes],
    *,
    max_attempts: int = 3,
    version: str = ScriptedClassifier.version,
) -> dict[str, uuid.UUID]:
    """Register each (external id, payload bytes) as a queued job; returns external id -> job id."""
    new = to_new_jobs([SourceDocument("test", ext, content) for ext, content in docs.items()], payloads, version)
    result = store.register(new, batch_key=BATCH, step="classify", max_attempts=max_attempts)
    assert result.new == len(docs)
    return {r.external_id: r.id for r in rows(store, "SELECT external_id, id FROM triage.jobs")}


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def scalar(store: JobStore, sql: str, **params: object) -> object:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def job(store: JobStore, job_id: uuid.UUID) -> sa.Row:
    return rows(store, "SELECT * FROM triage.jobs WHERE id = :id", id=job_id)[0]


def review_of(store: JobStore, job_id: uuid.UUID) -> list[sa.Row]:
    return rows(store, "SELECT * FROM triage.manual_review WHERE job_id = :id", id=job_id)


def settings(**kw: Any) -> RunSettings:
    base: dict[str, Any] = {"owner": "test-worker", "batch_size": 50, "lease_seconds": 60, "retry_soon_seconds": 5}
    return RunSettings(**{**base, **kw})


def classify(
    store: JobStore, classifier: Classifier, payloads: PayloadStore, *, run: RunSettings | None = None, **kw: Any
) -> StepReport:
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(**kw))
    try:
        return run_step(store, handler, batch_key=BATCH, settings=run or settings())
    finally:
        handler.close()


@pytest.fixture
def fast_store(engine: sa.Engine) -> JobStore:
    return JobStore(engine, retry_policy=FAST, rng=random.Random(3))


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


# -- the model's outcomes ---------------------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_accepted_completes_with_label_classification_and_event_in_one_transaction(
    store: JobStore, payloads: PayloadStore
) -> None:
    text = "I was charged twice on my invoice and the payment failed, please check my billing"
    classifier = KeywordClassifier(TAXONOMY)
    ids = register(store, payloads, {"T-1": document("T-1", text, "Invoice")}, version=classifier.version)
    report = classify(store, classifier, payloads, confidence_threshold=0.5)
    assert report.outcomes["Complete"] == 1
    j = job(store, ids["T-1"])
    assert (j.status, j.attempt, j.lease_owner) == ("completed", 1, None)
    label = rows(store, "SELECT * FROM triage.document_labels")
    assert [(r.source, r.external_id, r.label, r.job_id, r.content_sha256, r.classifier_version) for r in label] == [
        ("test", "T-1", "billing", j.id, j.content_sha256, classifier.version)
    ]
    cls = rows(store, "SELECT * FROM triage.classifications")
    assert [(c.job_id, c.attempt, c.label, c.outcome, c.classifier_version) for c in cls] == [
        (j.id, 1, "billing", "accepted", classifier.version)
    ]
    assert cls[0].confidence == label[0].confidence >= 0.5
    event = rows(store, "SELECT * FROM triage.outbox WHERE event_type = 'job.completed'")
    assert [(e.job_id, e.attempt) for e in event] == [(j.id, 1)]
    done = rows(store, "SELECT at FROM triage.job_events WHERE job_id = :id AND to_status = 'completed'", id=j.id)
    # now() is the transaction's start: one shared timestamp means one transaction wrote them all.
    assert {cls[0].created_at, label[0].updated_at, event[0].created_at, done[0].at, j.updated_at} == {j.updated_at}
    claimed = rows(store, "SELECT at FROM triage.job_events WHERE job_id = :id AND to_status = 'running'", id=j.id)
    assert claimed[0].at != j.updated_at  # the claim was its own, earlier transaction


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_inconclusive_goes_to_review(store: JobStore, payloads: PayloadStore) -> None:
    ids = register(
        store,
        payloads,
        {"T-1": document("T-1", "I contacted you last week and I am still waiting.")},
        version=KeywordClassifier(TAXONOMY).version,
    )
    classify(store, KeywordClassifier(TAXONOMY), payloads)
    j = job(store, ids["T-1"])
    assert (j.status, j.status_reason) == ("manual_review", "inconclusive")
    [review] = review_of(store, j.id)
    assert (review.reason, review.resolved_at, review.attempts) == ("inconclusive", None, 1)
    # the answer's uncertainty (its confidence: no candidates) orders the queue least sure first
    assert review.context == {"label": None, "confidence": 0.0, "threshold": 0.7, "uncertainty": 0.0}
    assert [(c.outcome, c.label) for c in rows(store, "SELECT * FROM triage.classifications")] == [
        ("inconclusive", None)
    ]
    assert scalar(store, "SELECT count(*) FROM triage.document_labels") == 0


@pytest.mark.parametrize(
    ("output", "threshold", "status", "reason", "outcome"),
    [
        pytest.param(ok("billing", 0.7), 0.7, "completed", "completed", "accepted", id="at-threshold-accepted"),
        pytest.param(ok("billing", 0.69), 0.7, "manual_review", "inconclusive", "inconclusive", id="below"),
        pytest.param(
            ModelOutput(None, 0.0, "label_outside_taxonomy", 2.0),
            0.7,
            "manual_review",
            "rejected_output",
            "rejected",
            id="rejected",
        ),
        pytest.param(
            ModelOutput("billing", 0.99, "schema_mismatch", 2.0),
            0.0,
            "manual_review",
            "rejected_output",
            "rejected",
            id="rejected-wins-over-confidence",
        ),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_model_outputs_are_routed(
    store: JobStore,
    payloads: PayloadStore,
    output: ModelOutput,
    threshold: float,
    status: str,
    reason: str,
    outcome: str,
) -> None:
    ids = register(store, payloads, {"T-1": document("T-1")})
    classify(store, ScriptedClassifier(lambda _r: output), payloads, confidence_threshold=threshold)
    j = job(store, ids["T-1"])
    assert (j.status, j.status_reason) == (status, reason)
    [c] = rows(store, "SELECT * FROM triage.classifications")
    assert (c.outcome, c.rejected_reason, c.attempt) == (outcome, output.rejected_reason, 1)
    assert len(review_of(store, j.id)) == (status == "manual_review")
    assert scalar(store, "SELECT count(*) FROM triage.document_labels") == (status == "completed")
    if outcome == "rejected":
        context = {"rejected_reason": output.rejected_reason}  # a rejected answer: no uncertainty (last)
        assert review_of(store, j.id)[0].context == context
        assert j.last_error_class == output.rejected_reason


# -- failures of the call -------------------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_permanent_error_goes_to_review_at_once(fast_store: JobStore, payloads: PayloadStore) -> None:
    def refuse(_r: ClassifyRequest) -> ModelOutput:
        raise PermanentClassifierError("bad_request", "HTTP 400")

    ids = register(fast_store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    classifier = ScriptedClassifier(by_external_id({"T-1": refuse}))
    classify(fast_store, classifier, payloads)
    bad = job(fast_store, ids["T-1"])
    assert (bad.status, bad.status_reason, bad.last_error_class, bad.attempt) == (
        "manual_review",
        "permanent_error",
        "bad_request",
        1,
    )
    [review] = review_of(fast_store, bad.id)
    assert (review.reason, review.error_class, review.last_error) == ("permanent_error", "bad_request", "HTTP 400")
    assert "latency_ms" in review.context
    assert job(fast_store, ids["T-2"]).status == "completed"  # one document's failure is not the batch's
    assert len([c for c in classifier.calls if c.external_id == "T-1"]) == 1


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_transient_retries_then_exhausts_into_review(fast_store: JobStore, payloads: PayloadStore) -> None:
    ids = register(fast_store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")}, max_attempts=3)
    classifier = ScriptedClassifier(by_external_id({"T-1": transient}))
    report = classify(fast_store, classifier, payloads)
    assert report.outcomes["exhausted"] == 1
    j = job(fast_store, ids["T-1"])
    assert (j.status, j.status_reason, j.attempt, j.last_error_class, j.next_attempt_at) == (
        "manual_review",
        "retries_exhausted",
        3,
        "server_error",
        None,
    )
    [review] = review_of(fast_store, j.id)
    assert (review.reason, review.error_class, review.attempts, review.resolved_at) == (
        "retries_exhausted",
        "server_error",
        3,
        None,
    )
    path = rows(
        fast_store, "SELECT from_status, to_status FROM triage.job_events WHERE job_id = :id ORDER BY id", id=j.id
    )
    assert [tuple(p) for p in path] == [
        (None, "queued"),
        ("queued", "running"),
        ("running", "retryable_failed"),
        ("retryable_failed", "running"),
        ("running", "retryable_failed"),
        ("retryable_failed", "running"),
        ("running", "manual_review"),
    ]
    assert [c.attempt for c in classifier.calls if c.external_id == "T-1"] == [1, 2, 3]
    assert job(fast_store, ids["T-2"]).status == "completed"


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_work_remains_when_retries_are_not_due_soon(store: JobStore, payloads: PayloadStore) -> None:
    # The default policy waits 1-2 s after a first failure: longer than this run is willing to wait.
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    classifier = ScriptedClassifier(by_external_id({"T-1": transient}))
    with pytest.raises(WorkRemains) as raised:
        classify(store, classifier, payloads, run=settings(retry_soon_seconds=0.2))
    assert raised.value.report.stopped == "WorkRemains"  # type: ignore[attr-defined]  # set by run_step
    j = job(store, ids["T-1"])
    assert (j.status, j.attempt, j.last_error_class) == ("retryable_failed", 1, "server_error")
    assert j.next_attempt_at is not None
    assert job(store, ids["T-2"]).status == "completed"

    # The next run (Airflow's retry) picks up only the unfinished job once it is due.
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'"))
    classifier.script = lambda _r: ok("shipping")
    report = classify(store, classifier, payloads, run=settings(retry_soon_seconds=0.2))
    assert report.claimed == 1
    assert (job(store, ids["T-1"]).status, job(store, ids["T-1"]).attempt) == ("completed", 2)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_jobs_retryable_soon_are_retried_in_the_same_run(fast_store: JobStore, payloads: PayloadStore) -> None:
    docs = {f"T-{i}": document(f"T-{i}") for i in range(6)}
    ids = register(fast_store, payloads, docs)

    def flaky(request: ClassifyRequest) -> ModelOutput:
        if request.attempt == 1 and request.external_id in {"T-1", "T-4"}:
            raise TransientClassifierError("rate_limited", "HTTP 429")
        return ok()

    report = classify(fast_store, ScriptedClassifier(flaky), payloads, run=settings(batch_size=2))
    assert report.claimed == 8
    assert report.outcomes["RetryLater"] == 2
    assert fast_store.status_counts(BATCH)[JobStatus.COMPLETED] == 6
    assert {ext: job(fast_store, i).attempt for ext, i in ids.items()} == {
        "T-0": 1,
        "T-1": 2,
        "T-2": 1,
        "T-3": 1,
        "T-4": 2,
        "T-5": 1,
    }
    assert scalar(fast_store, "SELECT count(*) FROM triage.classifications") == 6  # only attempts with an output


# -- failures of the payload --------------------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_payload_gone_from_a_healthy_store_goes_to_review(store: JobStore, payloads: PayloadStore) -> None:
    """The base and the pack's folder are there, the pack is not: the payload is gone for
    good, and a person decides (a review row with the reason), not a silent terminal state."""
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    pack = payloads.object_path(job(store, ids["T-1"]).payload_ref)
    assert pack == payloads.object_path(job(store, ids["T-2"]).payload_ref)  # one pack holds both
    pack.unlink()
    classifier = ScriptedClassifier(lambda _r: ok())
    classify(store, classifier, payloads)
    for i in ids.values():
        j = job(store, i)
        assert (j.status, j.status_reason, j.last_error_class) == (
            "manual_review",
            "missing_payload",
            "missing_payload",
        )
        assert [(r.reason, r.resolved_at) for r in review_of(store, j.id)] == [("missing_payload", None)]
    assert classifier.calls == []


def _unmount(base: Path) -> None:
    base.rename(base.with_name("away"))


def end_parking(store: JobStore) -> None:
    """Bring the end of an outage's parking forward to now (instead of waiting it out)."""
    with store.transaction("test") as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))


def _empty_mount_point(base: Path) -> None:
    _unmount(base)
    base.mkdir()


@pytest.mark.parametrize(
    "unmount", [pytest.param(_unmount, id="base-absent"), pytest.param(_empty_mount_point, id="base-empty")]
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_missing_payload_mount_parks_the_batch_and_stops_the_step(
    store: JobStore, payloads: PayloadStore, tmp_path: Path, unmount: Callable[[Path], None]
) -> None:
    """No payload of the store can be read: the store is down, not the documents. Nothing
    fails, no attempt is spent, the batch is parked (``outage:payload_store``), the step stops as
    for an open circuit (Airflow retries it), and once the volume is back and the parking is
    over the same jobs complete."""
    ids = register(store, payloads, {f"T-{n}": document(f"T-{n}") for n in range(30)})
    base = tmp_path / "payloads"
    unmount(base)
    classifier = ScriptedClassifier(lambda _r: ok())
    with pytest.raises(CircuitOpen, match="payload store is unavailable"):
        classify(store, classifier, payloads, run=settings(batch_size=10))
    assert rows(store, "SELECT status, attempt, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2, 3") == [
        ("waiting", 0, "outage:payload_store", 30)
    ]
    assert scalar(store, "SELECT count(*) FROM triage.manual_review") == 0
    assert classifier.calls == []
    end_parking(store)
    if base.exists():
        base.rmdir()
    base.with_name("away").rename(base)  # the volume is back
    classify(store, classifier, payloads)
    assert {job(store, i).status for i in ids.values()} == {"completed"}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_absent_pack_folder_is_retried_not_failed(store: JobStore, payloads: PayloadStore) -> None:
    """The base is there but the pack's folder is not (a half-mounted or half-restored store):
    transient, like an unreadable pack, bounded by the job's attempts."""
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    elsewhere, _ = payloads.put(b"keeps the base non-empty")
    pack = payloads.object_path(job(store, ids["T-1"]).payload_ref)
    assert elsewhere[:2] != pack.name[:2]
    pack.unlink()
    pack.parent.rmdir()
    classifier = ScriptedClassifier(lambda _r: ok())
    with pytest.raises(WorkRemains):
        classify(store, classifier, payloads, run=settings(retry_soon_seconds=0))
    for i in ids.values():
        j = job(store, i)
        assert (j.status, j.attempt, j.last_error_class) == ("retryable_failed", 1, "payload_unavailable")
    assert classifier.calls == []


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_payload_ref_outside_the_store_is_refused_and_never_read(
    store: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    """``payload_ref`` is data in a row. One naming another file, ``..``, another store or a URL
    goes to review (``payload_ref_invalid``) whatever hash it claims: a right guess of a
    secret's byte and a wrong one end the same way, so the verified read is no oracle."""
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"s3cr3t")
    other = PayloadStore(tmp_path / "other")
    foreign_doc = document("T-foreign")
    _, foreign = other.put(foreign_doc)
    remote = PayloadStore(f"memory://triage-test-{uuid.uuid4().hex}")
    remote_doc = document("T-remote")
    _, remote_ref = remote.put(remote_doc)
    own_digest, own_ref = payloads.put(document("T-own"))
    hostile = {
        "right-guess": (f"{secret.as_uri()}#offset=0&length=1", hashlib.sha256(b"s").hexdigest()),
        "wrong-guess": (f"{secret.as_uri()}#offset=0&length=1", hashlib.sha256(b"x").hexdigest()),
        "dot-dot": (
            f"{own_ref.rsplit('/', 2)[0]}/{own_digest[:2]}/../../secret.txt",
            hashlib.sha256(b"s3cr3t").hexdigest(),
        ),
        "other-store": (foreign, hashlib.sha256(foreign_doc).hexdigest()),
        "url": (remote_ref, hashlib.sha256(remote_doc).hexdigest()),
        "plain-path": (str(other.object_path(foreign)), hashlib.sha256(foreign_doc).hexdigest()),
    }
    ids = {}
    for name, (ref, digest) in hostile.items():
        key = idempotency_key("test", name, digest, ScriptedClassifier.version)
        result = store.register(
            [NewJob(key, "test", name, digest, ref, ScriptedClassifier.version)],
            batch_key=BATCH,
            step="classify",
            max_attempts=3,
        )
        ids[name] = result.new_ids[0]
    classifier = ScriptedClassifier(lambda _r: ok())
    classify(store, classifier, payloads)
    assert classifier.calls == []
    for name, i in ids.items():
        j = job(store, i)
        assert (j.status, j.status_reason, j.last_error_class) == (
            "manual_review",
            "payload_ref_invalid",
            "payload_ref_invalid",
        ), name
        assert [r.reason for r in review_of(store, i)] == ["payload_ref_invalid"], name
        assert "s3cr3t" not in (j.last_error or "")


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_corrupt_payload_goes_to_review_and_its_pack_mates_do_not(store: JobStore, payloads: PayloadStore) -> None:
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    j = job(store, ids["T-1"])
    start = int(j.payload_ref.split("#offset=")[1].split("&")[0])
    path = payloads.object_path(j.payload_ref)
    body = bytearray(path.read_bytes())
    at = body.index(b"Please help", start)
    body[at : at + 11] = b"Please HELP"  # same size, other bytes, inside T-1's range only
    path.write_bytes(bytes(body))
    classifier = ScriptedClassifier(lambda _r: ok())
    classify(store, classifier, payloads)
    j = job(store, ids["T-1"])
    assert (j.status, j.status_reason, j.last_error_class) == ("manual_review", "payload_corrupt", "payload_corrupt")
    assert [r.reason for r in review_of(store, j.id)] == ["payload_corrupt"]
    assert job(store, ids["T-2"]).status == "completed"
    assert [c.external_id for c in classifier.calls] == ["T-2"]


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_unreadable_pack_is_retried_not_failed(store: JobStore, payloads: PayloadStore) -> None:
    """An I/O error is the store's, not the document's: the jobs retry (bounded by their
    attempts) instead of failing for good; the classifier is not called."""
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2")})
    pack = payloads.object_path(job(store, ids["T-1"]).payload_ref)
    pack.unlink()
    pack.mkdir()  # reading it now raises IsADirectoryError, an OSError other than "not found"
    classifier = ScriptedClassifier(lambda _r: ok())
    with pytest.raises(WorkRemains):  # the retries are not due within this run
        classify(store, classifier, payloads, run=settings(retry_soon_seconds=0))
    for i in ids.values():
        j = job(store, i)
        assert (j.status, j.attempt, j.last_error_class) == ("retryable_failed", 1, "payload_unavailable")
    assert classifier.calls == []


def register_raw(store: JobStore, payloads: PayloadStore, external_id: str, content: bytes) -> uuid.UUID:
    digest, ref = payloads.put(content)
    key = idempotency_key("test", external_id, digest, ScriptedClassifier.version)
    result = store.register(
        [NewJob(key, "test", external_id, digest, ref, ScriptedClassifier.version)],
        batch_key=BATCH,
        step="classify",
        max_attempts=3,
    )
    return result.new_ids[0]


V2 = canonical_json_bytes(
    {
        "schema_version": 2,
        "external_id": "T-9",
        "subject": "s",
        "body": "b",
        "received_at": "2026-11-01T09:00:00Z",
        "channel": None,
        "language": "en",
    }
)


@pytest.mark.parametrize(
    ("content", "status", "reason", "error_class"),
    [
        pytest.param(
            V2, "terminal_failed", "unsupported_schema_version", "unsupported_schema_version", id="schema-version-2"
        ),
        pytest.param(
            b'{"schema_version": 1, "external_id": "T-9"',
            "manual_review",
            "malformed_input",
            "invalid_json",
            id="invalid-json",
        ),
        pytest.param(b"\xff\xfe", "manual_review", "malformed_input", "invalid_utf8", id="invalid-utf8"),
        pytest.param(
            canonical_json_bytes({"schema_version": 1, "external_id": "T-9"}),
            "manual_review",
            "malformed_input",
            "schema_mismatch",
            id="schema-mismatch",
        ),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_unreadable_payloads_are_routed(
    store: JobStore, payloads: PayloadStore, content: bytes, status: str, reason: str, error_class: str
) -> None:
    job_id = register_raw(store, payloads, "T-9", content)
    classifier = ScriptedClassifier(lambda _r: ok())
    classify(store, classifier, payloads)
    j = job(store, job_id)
    assert (j.status, j.status_reason, j.last_error_class) == (status, reason, error_class)
    assert len(review_of(store, job_id)) == (status == "manual_review")
    assert classifier.calls == []


# -- the dependency as a whole ----------------------------------------------------------------


@pytest.mark.parametrize("error_class", ["unauthorized", "forbidden", "not_found"])
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_misconfigured_dependency_releases_the_job_and_stops(
    store: JobStore, payloads: PayloadStore, error_class: str
) -> None:
    def refuse(_r: ClassifyRequest) -> ModelOutput:
        raise PermanentClassifierError(error_class, "HTTP 4xx")

    ids = register(store, payloads, {f"T-{i}": document(f"T-{i}") for i in range(5)})
    classifier = ScriptedClassifier(refuse)
    with pytest.raises(DependencyMisconfigured):
        classify(store, classifier, payloads)
    assert len(classifier.calls) == 1  # the rest were released unstarted
    for job_id in ids.values():
        j = job(store, job_id)
        assert (j.status, j.attempt, j.lease_owner, j.status_reason) == ("queued", 0, None, "released")
    assert scalar(store, "SELECT count(*) FROM triage.manual_review") == 0
    assert scalar(store, "SELECT count(*) FROM triage.classifications") == 0


def rate_limited(_request: ClassifyRequest) -> ModelOutput:
    raise TransientClassifierError("rate_limited", "HTTP 429")


@pytest.mark.parametrize(
    ("concurrency", "exact"),
    [pytest.param(1, True, id="sequential"), pytest.param(4, False, id="concurrent")],
)
@pytest.mark.parametrize(
    ("script", "calls"),
    [
        pytest.param(transient, 3, id="503-all-down-rule-after-3-jobs"),
        pytest.param(rate_limited, 20, id="429-window-rule-after-20-calls"),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_circuit_breaker_stops_before_burning_every_attempt(
    fast_store: JobStore, payloads: PayloadStore, concurrency: int, exact: bool, script: Script, calls: int
) -> None:
    register(fast_store, payloads, {f"T-{i:02d}": document(f"T-{i:02d}") for i in range(30)}, max_attempts=3)
    classifier = ScriptedClassifier(script)
    with pytest.raises(CircuitOpen) as raised:
        classify(fast_store, classifier, payloads, run=settings(batch_size=30), concurrency=concurrency)
    assert raised.value.report.claimed == 30  # type: ignore[attr-defined]  # set by run_step
    # The failed calls were the outage's, not the jobs': every job is parked, no attempt spent.
    states = rows(fast_store, "SELECT status, attempt, status_reason, count(*) AS n FROM triage.jobs GROUP BY 1, 2, 3")
    assert {(s.status, s.attempt, s.status_reason): s.n for s in states} == {("waiting", 0, "outage:model"): 30}
    assert len(classifier.calls) >= calls
    if exact:
        assert len(classifier.calls) == calls
    assert scalar(fast_store, "SELECT count(*) FROM triage.manual_review") == 0
    assert scalar(fast_store, "SELECT count(*) FROM triage.jobs WHERE lease_token IS NOT NULL") == 0


# -- a separate persist step ----------------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_separate_persist_advances_then_completes_with_the_classified_label(
    store: JobStore, payloads: PayloadStore
) -> None:
    ids = register(store, payloads, {"T-1": document("T-1"), "T-2": document("T-2"), "T-3": document("T-3")})
    answers = {
        "T-1": lambda _r: ok("shipping", 0.95),
        "T-2": lambda _r: ok("refund_request", 0.8),
        "T-3": lambda _r: ok("billing", 0.1),
    }
    classify(store, ScriptedClassifier(by_external_id(answers)), payloads, separate_persist=True)
    assert {ext: (job(store, i).status, job(store, i).step, job(store, i).attempt) for ext, i in ids.items()} == {
        "T-1": ("queued", "persist", 1),  # attempts are numbered on; persist's budget starts after 1
        "T-2": ("queued", "persist", 1),
        "T-3": ("manual_review", "classify", 1),
    }
    assert scalar(store, "SELECT count(*) FROM triage.document_labels") == 0
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == 0

    actions: list[tuple[str, str]] = []
    handler = PersistHandler(store, action=lambda j, label: actions.append((j.idempotency_key, label.label)))
    report = run_step(store, handler, batch_key=BATCH, settings=settings())
    assert report.outcomes["Complete"] == 2
    labels = {
        r.external_id: (r.label, r.confidence, r.classifier_version, r.job_id)
        for r in rows(store, "SELECT * FROM triage.document_labels")
    }
    assert labels == {
        "T-1": ("shipping", 0.95, "scripted-v1", ids["T-1"]),
        "T-2": ("refund_request", 0.8, "scripted-v1", ids["T-2"]),
    }
    assert sorted(label for _key, label in actions) == ["refund_request", "shipping"]
    assert {key for key, _ in actions} == {job(store, ids[e]).idempotency_key for e in ("T-1", "T-2")}
    assert {(job(store, ids[e]).status, job(store, ids[e]).step) for e in ("T-1", "T-2")} == {("completed", "persist")}
    assert scalar(store, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == 2
    assert job(store, ids["T-3"]).status == "manual_review"


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_persist_never_guesses_a_label_for_a_job_without_an_accepted_classification(
    store: JobStore, payloads: PayloadStore
) -> None:
    ids = register(store, payloads, {"T-1": document("T-1")})
    claim = store.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="w")
    store.record(claim, [Advance(ids["T-1"], 1, "persist")])  # advanced with no classification
    run_step(store, PersistHandler(store), batch_key=BATCH, settings=settings())
    j = job(store, ids["T-1"])
    assert (j.status, j.status_reason, j.step) == ("terminal_failed", "missing_classification", "persist")
    assert scalar(store, "SELECT count(*) FROM triage.document_labels") == 0


@pytest.mark.own_database  # a lease runs out in time
def test_a_slow_classifier_keeps_its_lease_by_heartbeat(store: JobStore, payloads: PayloadStore) -> None:
    ids = register(store, payloads, {"T-1": document("T-1")})

    def slow(_r: ClassifyRequest) -> ModelOutput:
        threading.Event().wait(1.6)  # longer than the lease: only the heartbeat keeps it
        return ok()

    classify(store, ScriptedClassifier(slow), payloads, run=settings(lease_seconds=1.0))
    assert job(store, ids["T-1"]).status == "completed"


# -- the failure drill ---------------------------------------------------------------------


@pytest.fixture
def second_engine(pg_server: DatabaseUrl, template_db: str) -> Iterator[sa.Engine]:
    """A second, independent migrated database, to replay a run from scratch."""
    name = f"triage_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    eng = create_engine(pg_server.with_database(name), pool_size=4)
    yield eng
    eng.dispose()
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


DRILL = DrillSettings(transient_error_rate=0.25, permanent_error_rate=0.1, inconclusive_rate=0.1, seed=42)


def drill_run(store: JobStore, base: Path) -> dict[str, tuple[object, ...]]:
    payloads = PayloadStore(base)
    classifier = build_classifier("keyword", taxonomy=TAXONOMY, drill=DRILL)
    assert type(classifier).__name__ == "DrillClassifier"
    retrieve(
        store,
        SyntheticSource(60, seed=1),
        payloads,
        start=START,
        end=END,
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )
    classify(store, classifier, payloads, run=settings(batch_size=16), concurrency=4)
    result = rows(
        store,
        """
        SELECT j.idempotency_key, j.status, j.status_reason, j.attempt, j.last_error_class, l.label
        FROM triage.jobs j LEFT JOIN triage.document_labels l ON l.job_id = j.id
    """,
    )
    return {r[0]: tuple(r[1:]) for r in result}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_drill_is_deterministic_and_every_job_settles(
    fast_store: JobStore, second_engine: sa.Engine, tmp_path: Path
) -> None:
    first = drill_run(fast_store, tmp_path / "one")
    second = drill_run(JobStore(second_engine, retry_policy=FAST, rng=random.Random(99)), tmp_path / "two")
    assert first == second
    assert len(first) == 60
    statuses = {v[0] for v in first.values()}
    assert statuses <= {"completed", "manual_review", "terminal_failed"}
    reasons = {v[1] for v in first.values()}
    assert {"completed", "permanent_error", "inconclusive"} <= reasons  # the drill did inject faults
    assert any(int(v[2]) > 1 for v in first.values())  # type: ignore[call-overload]  # and some jobs needed a retry
    completed = sum(1 for v in first.values() if v[0] == "completed")
    assert scalar(fast_store, "SELECT count(*) FROM triage.document_labels") == completed
    assert all((v[4] is not None) == (v[0] == "completed") for v in first.values())
    assert (
        scalar(
            fast_store,
            """
        SELECT count(*) FROM triage.jobs j
        WHERE (j.status = 'manual_review') <> EXISTS (
            SELECT 1 FROM triage.manual_review r WHERE r.job_id = j.id AND r.resolved_at IS NULL)
    """,
        )
        == 0
    )
