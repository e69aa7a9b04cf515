"""The classify step with the real OpenAI-compatible classifier against a real HTTP fake on
loopback, and a real PostgreSQL: what each kind of reply does to the job."""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply, keyword_responder
from tests.ledger.helpers import classify_try, documents, llm_classifier, register_documents
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.states import JobStatus
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifySettings
from triage.pipeline.steps import (
    CircuitOpen,
    DependencyMisconfigured,
    RunSettings,
    StepError,
    StepReport,
    WorkRemains,
)

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = Taxonomy.load()


def register(
    store: JobStore, payloads: PayloadStore, n: int, version: str, *, max_attempts: int = 3
) -> list[uuid.UUID]:
    result = register_documents(store, payloads, documents(n), version, batch_key=BATCH, max_attempts=max_attempts)
    assert result.new == n
    return list(result.new_ids)


def classify(
    store: JobStore,
    classifier: OpenAICompatibleClassifier,
    payloads: PayloadStore,
    *,
    concurrency: int = 1,
    batch_size: int = 50,
    retry_soon_seconds: float = 0.0,
) -> StepReport:
    settings = RunSettings(
        owner="llm-test", batch_size=batch_size, lease_seconds=60, retry_soon_seconds=retry_soon_seconds
    )
    return classify_try(
        store, classifier, payloads, settings, batch_key=BATCH, classify=ClassifySettings(concurrency=concurrency)
    )


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def the_job(store: JobStore) -> sa.Row:
    [row] = rows(store, "SELECT * FROM triage.jobs")
    return row


def header(headers: dict[str, str], name: str) -> str | None:
    return next((v for k, v in headers.items() if k.lower() == name.lower()), None)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_valid_answer_completes_with_latency_and_tokens(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server, price_per_1k_prompt=0.5, price_per_1k_completion=1.5)
    [job_id] = register(store, payloads, 1, classifier.version)
    server.enqueue(Reply.ok("shipping", 0.93, prompt_tokens=321, completion_tokens=17))
    classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.attempt) == ("completed", 1)
    [c] = rows(store, "SELECT * FROM triage.classifications")
    assert (c.job_id, c.label, c.confidence, c.outcome, c.classifier_version) == (
        job_id,
        "shipping",
        0.93,
        "accepted",
        classifier.version,
    )
    assert (c.prompt_tokens, c.completion_tokens) == (321, 17)
    assert c.latency_ms is not None
    assert c.latency_ms > 0
    assert float(c.cost_usd) == pytest.approx(321 / 1000 * 0.5 + 17 / 1000 * 1.5, abs=1e-6)
    assert [(r.label, r.job_id) for r in rows(store, "SELECT * FROM triage.document_labels")] == [("shipping", job_id)]
    # The request carried the job's identity, and the key as the provider's idempotency key.
    [headers] = server.headers
    assert header(headers, "Idempotency-Key") == job.idempotency_key
    assert header(headers, "X-Correlation-ID") == job.correlation_id
    assert header(headers, "Authorization") == "Bearer sk-test"
    assert server.requests[0]["messages"][1]["content"] == "Invoice\n\nI was charged twice, ticket 0"


@pytest.mark.parametrize(
    ("reply", "error_class"),
    [
        pytest.param(Reply.status_only(429), "rate_limited", id="429"),
        pytest.param(Reply.status_only(500), "server_error", id="500"),
        pytest.param(Reply.status_only(503), "server_error", id="503"),
        pytest.param(Reply.status_only(408), "timeout", id="408"),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_transient_replies_are_retryable(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, reply: Reply, error_class: str
) -> None:
    classifier = llm_classifier(server)
    register(store, payloads, 1, classifier.version)
    server.enqueue(reply)
    with pytest.raises(WorkRemains):  # the default backoff (1-2 s) is not "soon" for this run
        classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.attempt, job.last_error_class, job.status_reason) == (
        "retryable_failed",
        1,
        error_class,
        error_class,
    )
    assert job.next_attempt_at is not None
    assert rows(store, "SELECT * FROM triage.classifications") == []
    assert rows(store, "SELECT * FROM triage.manual_review") == []


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_slow_reply_times_out_and_is_retryable(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server, timeout_s=0.2)
    register(store, payloads, 1, classifier.version)
    server.enqueue(Reply.slow(1000))
    with pytest.raises(WorkRemains):
        classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.last_error_class) == ("retryable_failed", "timeout")


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_transient_failure_then_success_completes_in_one_run(
    engine: sa.Engine, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    store = JobStore(engine, retry_policy=RetryPolicy(base_seconds=0.01, cap_seconds=0.05), rng=random.Random(1))
    classifier = llm_classifier(server)
    register(store, payloads, 1, classifier.version)
    server.enqueue(Reply.status_only(429), Reply.status_only(502))
    classify(store, classifier, payloads, retry_soon_seconds=5)
    job = the_job(store)
    assert (job.status, job.attempt) == ("completed", 3)
    keys = [header(h, "Idempotency-Key") for h in server.headers]
    assert keys == [job.idempotency_key] * 3  # a retry is the same logical operation


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_dependency_that_is_down_opens_the_circuit(store: JobStore, payloads: PayloadStore) -> None:
    with socket.socket() as probe:  # a loopback port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    classifier = OpenAICompatibleClassifier(
        base_url=f"http://127.0.0.1:{port}/v1", api_key=None, model="m", taxonomy=TAXONOMY, timeout_s=2
    )
    register(store, payloads, 25, classifier.version)
    with pytest.raises(CircuitOpen):
        classify(store, classifier, payloads, batch_size=25)
    states = rows(store, "SELECT status, attempt, last_error_class, count(*) AS n FROM triage.jobs GROUP BY 1, 2, 3")
    # an outage, not the jobs' failure: all parked (outage:model), no attempt spent
    assert {(s.status, s.attempt, s.last_error_class): s.n for s in states} == {("waiting", 0, "connection_error"): 25}


@pytest.mark.parametrize(
    ("reply", "rejected_reason"),
    [
        pytest.param(Reply.malformed_content(), "invalid_json", id="malformed-json"),
        pytest.param(Reply.ok("refund_please"), "label_outside_taxonomy", id="label-outside-taxonomy"),
        pytest.param(Reply.malformed_content('{"category": "billing"}'), "schema_mismatch", id="wrong-schema"),
        pytest.param(Reply.malformed_content(""), "empty_content", id="empty"),
        pytest.param(Reply.raw_body(b"<html>gateway</html>"), "invalid_response", id="not-a-completion"),
    ],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_bad_answers_are_rejected_into_review(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, reply: Reply, rejected_reason: str
) -> None:
    classifier = llm_classifier(server)
    register(store, payloads, 1, classifier.version)
    server.enqueue(reply)
    classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.status_reason, job.attempt) == ("manual_review", "rejected_output", 1)
    [c] = rows(store, "SELECT * FROM triage.classifications")
    assert (c.outcome, c.rejected_reason, c.label) == ("rejected", rejected_reason, None)
    [review] = rows(store, "SELECT * FROM triage.manual_review")
    assert (review.reason, review.context) == ("rejected_output", {"rejected_reason": rejected_reason})
    assert server.request_count == 1  # a bad answer is not retried


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_low_confidence_answer_is_inconclusive(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    register(store, payloads, 1, classifier.version)
    server.enqueue(Reply.ok("billing", 0.3))
    classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.status_reason) == ("manual_review", "inconclusive")


@pytest.mark.parametrize(
    ("status", "error_class"),
    [pytest.param(400, "bad_request", id="400"), pytest.param(422, "client_error", id="422")],
)
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_refused_request_goes_to_review(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, status: int, error_class: str
) -> None:
    classifier = llm_classifier(server)
    register(store, payloads, 1, classifier.version)
    server.enqueue(Reply.status_only(status))
    classify(store, classifier, payloads)
    job = the_job(store)
    assert (job.status, job.status_reason, job.last_error_class) == ("manual_review", "permanent_error", error_class)
    assert job.last_error == f"HTTP {status} (fake_error, {status})"
    [review] = rows(store, "SELECT * FROM triage.manual_review")
    assert (review.reason, review.error_class) == ("permanent_error", error_class)


@pytest.mark.parametrize("status", [401, 403, 404])
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_misconfigured_endpoint_releases_and_stops(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, status: int
) -> None:
    classifier = llm_classifier(server)
    register(store, payloads, 3, classifier.version)
    server.responder = lambda _body: Reply.status_only(status)
    with pytest.raises(DependencyMisconfigured):
        classify(store, classifier, payloads)
    assert server.request_count == 1
    states = rows(store, "SELECT status, attempt, lease_owner FROM triage.jobs")
    assert [tuple(s) for s in states] == [("queued", 0, None)] * 3
    assert rows(store, "SELECT * FROM triage.manual_review") == []


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_wrong_base_url_is_a_misconfiguration(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = OpenAICompatibleClassifier(
        base_url=server.base_url + "/wrong", api_key=None, model="m", taxonomy=TAXONOMY
    )
    register(store, payloads, 2, classifier.version)
    with pytest.raises(DependencyMisconfigured):
        classify(store, classifier, payloads)
    assert {s.status for s in rows(store, "SELECT status FROM triage.jobs")} == {"queued"}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_concurrent_calls_complete_every_job_with_one_call_each(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    server.responder = keyword_responder(TAXONOMY)
    classifier = llm_classifier(server)
    register(store, payloads, 50, classifier.version)
    report = classify(store, classifier, payloads, concurrency=8, batch_size=20)
    assert report.claimed == 50
    assert store.status_counts(BATCH)[JobStatus.COMPLETED] == 50
    keys = Counter(header(h, "Idempotency-Key") for h in server.headers)
    jobs = {r.idempotency_key for r in rows(store, "SELECT idempotency_key FROM triage.jobs")}
    assert set(keys) == jobs
    assert set(keys.values()) == {1}
    assert len(rows(store, "SELECT * FROM triage.document_labels WHERE label = 'billing'")) == 50


class _BadEncoding(BaseHTTPRequestHandler):
    """Answers 200 with a body that does not match its declared ``Content-Encoding`` (a broken
    proxy or a truncated gzip stream): the call failed, the model never answered."""

    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b"this is not gzip"
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", "gzip")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_undecodable_reply_is_a_job_outcome_not_a_crash(store: JobStore, payloads: PayloadStore) -> None:
    """Every failure of the call must become an outcome of the job (ClassifyHandler.one never
    raises for the job's own failures); no job may be left ``running`` under a dead lease."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _BadEncoding)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        classifier = OpenAICompatibleClassifier(
            base_url=f"http://{host!s}:{port}/v1", api_key=None, model="m", taxonomy=TAXONOMY
        )
        register(store, payloads, 2, classifier.version)
        with contextlib.suppress(StepError):  # stopping the step is fine; any other exception is not
            classify(store, classifier, payloads)
    finally:
        server.shutdown()
        server.server_close()
    states = {r.status for r in rows(store, "SELECT status FROM triage.jobs")}
    assert "running" not in states
    assert states <= {"retryable_failed", "manual_review"}
