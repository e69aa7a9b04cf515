"""The classify handler's failure classification, without a database: what each classifier
result, classifier error and payload read becomes as the outcome the ledger records.

The classifier, the payload store and the clock are collaborators, mocked with ``mocker``; the
handler and its circuit breaker are the code under test (the breaker is real, and spied on). How
the ledger applies each outcome (``RetryLater`` to ``retryable_failed`` with backoff,
``SendToReview`` to ``manual_review``, ``Fail`` to ``terminal_failed``, ``Release`` back to
``queued``) is the store's, tested on PostgreSQL in tests/ledger/test_pipeline_classify.py.
"""

from __future__ import annotations

import hashlib
import json
import logging
import uuid
from datetime import UTC, datetime
from typing import Any, Literal

import pytest
from pytest_mock import MockerFixture

from triage.classifiers.base import (
    Classifier,
    ClassifyRequest,
    ModelOutput,
    PermanentClassifierError,
    TransientClassifierError,
)
from triage.contracts.documents import DocumentPayload
from triage.jobs.vocabulary.models import (
    Advance,
    ClaimedJob,
    ClassificationRecord,
    Complete,
    Fail,
    LabelWrite,
    Outcome,
    Park,
    Release,
    RetryLater,
    SendToReview,
)
from triage.payloads import (
    PayloadBaseMissing,
    PayloadCorrupt,
    PayloadMissing,
    PayloadRefInvalid,
    PayloadStore,
    PayloadUnavailable,
)
from triage.pipeline.classify import OUTAGE_SECONDS, CircuitBreaker, ClassifyHandler, ClassifySettings
from triage.pipeline.steps import CircuitOpen, DependencyMisconfigured, claim_size

VERSION = "keyword-test-1"
THRESHOLD = 0.7
DOCUMENT = DocumentPayload(
    external_id="T-1", subject="Refund", body="the secret body", received_at=datetime(2026, 11, 5, tzinfo=UTC)
)
PAYLOAD = DOCUMENT.to_bytes()


def claimed(n: int = 0, attempt: int = 1) -> ClaimedJob:
    return ClaimedJob(
        id=uuid.UUID(int=n + 1),
        idempotency_key=f"key-{n}",
        source="synthetic",
        external_id=f"T-{n}",
        content_sha256="ab" * 32,
        payload_ref=f"payloads/ab/{n}",
        classifier_version=VERSION,
        correlation_id=f"corr-{n}",
        step="classify",
        attempt=attempt,
        max_attempts=3,
        created_at=datetime(2026, 11, 5, tzinfo=UTC),
    )


def output(label: str | None = "billing", confidence: float = 0.9, rejected: str | None = None) -> ModelOutput:
    return ModelOutput(label=label, confidence=confidence, rejected_reason=rejected, latency_ms=12.0)


def record(
    outcome: Literal["accepted", "inconclusive", "rejected"],
    label: str | None,
    confidence: float,
    rejected: str | None = None,
) -> ClassificationRecord:
    return ClassificationRecord(
        label=label,
        confidence=confidence,
        outcome=outcome,
        classifier_version=VERSION,
        rejected_reason=rejected,
        latency_ms=12.0,
        input_sha256=hashlib.sha256(b"Refund\n\nthe secret body").hexdigest(),  # the content cache's key
    )


@pytest.fixture
def classifier(mocker: MockerFixture) -> Any:
    fake = mocker.Mock(spec=Classifier)
    fake.version = VERSION
    return fake


@pytest.fixture
def payloads(mocker: MockerFixture) -> Any:
    return mocker.Mock(spec=PayloadStore)


@pytest.fixture
def breaker(mocker: MockerFixture) -> Any:
    """A real breaker with its ``record`` spied on: which calls the handler counts as transient."""
    real = CircuitBreaker()
    mocker.spy(real, "record")
    return real


@pytest.fixture
def clock(mocker: MockerFixture) -> Any:
    """The handler's clock: every classifier call takes 250 ms."""
    fake = mocker.patch("triage.pipeline.classify.time")
    fake.perf_counter.side_effect = [100.0, 100.25]
    return fake


def make_handler(classifier: Any, payloads: Any, breaker: CircuitBreaker, **settings: Any) -> ClassifyHandler:
    return ClassifyHandler(classifier, payloads, ClassifySettings(confidence_threshold=THRESHOLD, **settings), breaker)


# -- model outputs: a result, never an exception -------------------------------------------------

JOB = claimed()


def review(reason: str, error_class: str | None, classification: ClassificationRecord, **context: Any) -> SendToReview:
    """The model's answer goes to a person (``manual_review``), never to the retry loop."""
    return SendToReview(JOB.id, 1, reason, error_class, None, classification=classification, context=context)


def complete(label: str, confidence: float) -> Complete:
    return Complete(JOB.id, 1, LabelWrite(label, confidence, VERSION), record("accepted", label, confidence))


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        pytest.param(output("billing", 0.9), complete("billing", 0.9), id="accepted"),
        pytest.param(output("billing", THRESHOLD), complete("billing", THRESHOLD), id="at-the-threshold-accepted"),
        pytest.param(
            output("billing", 0.69),
            review(
                "inconclusive",
                "inconclusive",
                record("inconclusive", "billing", 0.69),
                label="billing",
                confidence=0.69,
                threshold=THRESHOLD,
            ),
            id="low-confidence-to-review",
        ),
        pytest.param(
            output(None, 0.0),
            review(
                "inconclusive",
                "inconclusive",
                record("inconclusive", None, 0.0),
                label=None,
                confidence=0.0,
                threshold=THRESHOLD,
            ),
            id="no-label-to-review",
        ),
        pytest.param(
            output(None, 0.0, "label_outside_taxonomy"),
            review(
                "rejected_output",
                "label_outside_taxonomy",
                record("rejected", None, 0.0, "label_outside_taxonomy"),
                rejected_reason="label_outside_taxonomy",
            ),
            id="malformed-output-to-review",
        ),
        pytest.param(
            output("billing", 0.99, "invalid_json"),
            review(
                "rejected_output",
                "invalid_json",
                record("rejected", "billing", 0.99, "invalid_json"),
                rejected_reason="invalid_json",
            ),
            id="rejected-wins-over-confidence",
        ),
        pytest.param(
            output("bil\x00ling", 0.95),
            review(
                "rejected_output",
                "label_not_storable",
                record("rejected", None, 0.95, "label_not_storable"),
                rejected_reason="label_not_storable",
            ),
            id="unstorable-label-to-review",
        ),
    ],
)
def test_a_model_output_becomes_its_outcome(
    classifier: Any, payloads: Any, breaker: Any, result: ModelOutput, expected: Outcome
) -> None:
    classifier.classify.return_value = result
    assert make_handler(classifier, payloads, breaker).one(JOB, PAYLOAD) == expected
    breaker.record.assert_called_once_with(False)  # an answer: the dependency is up


def test_the_classifier_gets_the_document_and_the_job_ids(classifier: Any, payloads: Any, breaker: Any) -> None:
    classifier.classify.return_value = output()
    make_handler(classifier, payloads, breaker).one(claimed(4, attempt=2), PAYLOAD)
    classifier.classify.assert_called_once_with(
        ClassifyRequest(
            job_id=str(uuid.UUID(int=5)),
            external_id="T-4",
            idempotency_key="key-4",
            correlation_id="corr-4",
            attempt=2,
            text="Refund\n\nthe secret body",
        )
    )


def test_an_accepted_label_advances_to_persist_when_persist_is_separate(
    classifier: Any, payloads: Any, breaker: Any
) -> None:
    classifier.classify.return_value = output("billing", 0.9)
    outcome = make_handler(classifier, payloads, breaker, separate_persist=True).one(JOB, PAYLOAD)
    assert outcome == Advance(JOB.id, 1, "persist", classification=record("accepted", "billing", 0.9))


# -- classifier errors: transient, permanent, misconfigured, unexpected ---------------------------


@pytest.mark.parametrize(
    ("error", "expected", "down"),
    [
        pytest.param(
            TransientClassifierError("timeout", "read timed out"),
            RetryLater(JOB.id, 1, "timeout", "read timed out"),
            True,
            id="timeout-retried",
        ),
        pytest.param(
            TransientClassifierError("rate_limited"),
            RetryLater(JOB.id, 1, "rate_limited", "rate_limited"),
            False,
            id="429-retried",
        ),
        pytest.param(
            TransientClassifierError("server_error", "HTTP 503"),
            RetryLater(JOB.id, 1, "server_error", "HTTP 503"),
            True,
            id="5xx-retried",
        ),
    ],
)
def test_a_transient_error_is_retried_and_counts_against_the_dependency(
    classifier: Any, payloads: Any, breaker: Any, error: Exception, expected: Outcome, down: bool
) -> None:
    classifier.classify.side_effect = error
    handler = make_handler(classifier, payloads, breaker)
    assert handler.one(JOB, PAYLOAD) == expected
    breaker.record.assert_called_once_with(True, dependency_down=down, job=JOB.id)
    assert handler.stop_reason() is None, "one transient failure does not stop the step"


def test_a_permanent_error_goes_to_review_at_once(classifier: Any, payloads: Any, breaker: Any, clock: Any) -> None:
    classifier.classify.side_effect = PermanentClassifierError("bad_request", "HTTP 400")
    handler = make_handler(classifier, payloads, breaker)
    assert handler.one(JOB, PAYLOAD) == SendToReview(
        JOB.id, 1, "permanent_error", "bad_request", "HTTP 400", context={"latency_ms": 250.0}
    )
    breaker.record.assert_called_once_with(False)  # the document's fault, not the dependency's
    assert handler.stop_reason() is None


@pytest.mark.parametrize("error_class", ["unauthorized", "forbidden", "not_found", "redirected"])
def test_a_misconfigured_dependency_releases_the_job_and_stops_the_step(
    classifier: Any, payloads: Any, breaker: Any, error_class: str
) -> None:
    classifier.classify.side_effect = PermanentClassifierError(error_class, "HTTP 4xx")
    handler = make_handler(classifier, payloads, breaker)
    assert handler.one(JOB, PAYLOAD) == Release(JOB.id, 1), "not the document's fault: no attempt spent"
    assert isinstance(handler.stop_reason(), DependencyMisconfigured)
    assert error_class in str(handler.stop_reason())
    later = claimed(1)
    assert handler.one(later, PAYLOAD) == Release(later.id, 1)
    assert classifier.classify.call_count == 1, "no further call to a dependency that refuses every call"


def test_an_unexpected_exception_is_a_transient_failure_logged_without_its_message(
    classifier: Any, payloads: Any, breaker: Any, caplog: pytest.LogCaptureFixture
) -> None:
    classifier.classify.side_effect = KeyError("the secret body")
    with caplog.at_level(logging.ERROR, logger="triage.pipeline.classify"):
        outcome = make_handler(classifier, payloads, breaker).one(JOB, PAYLOAD)
    assert outcome == RetryLater(JOB.id, 1, "unexpected_error", "KeyError")
    breaker.record.assert_called_once_with(True)
    assert "KeyError" in caplog.text
    assert "secret" not in caplog.text, "the exception's message may echo the document"


# -- payload reads: the classifier is never called -------------------------------------------------


@pytest.mark.parametrize(
    ("content", "kind", "reason", "error_class"),
    [
        pytest.param(
            PayloadUnavailable("permission denied"),
            RetryLater,
            None,
            "payload_unavailable",
            id="store-unreadable-retried",
        ),
        pytest.param(
            PayloadMissing("pack gone"), SendToReview, "missing_payload", "missing_payload", id="payload-gone-to-review"
        ),
        pytest.param(
            PayloadRefInvalid("not under the base"),
            SendToReview,
            "payload_ref_invalid",
            "payload_ref_invalid",
            id="foreign-ref-to-review",
        ),
        pytest.param(
            PayloadCorrupt("hash mismatch"), SendToReview, "payload_corrupt", "payload_corrupt", id="corrupt-to-review"
        ),
        pytest.param(b"\xff\xfe", SendToReview, "malformed_input", "invalid_utf8", id="not-utf8-to-review"),
        pytest.param(b"{not json", SendToReview, "malformed_input", "invalid_json", id="not-json-to-review"),
        pytest.param(
            json.dumps({"schema_version": 1, "subject": "s"}).encode(),
            SendToReview,
            "malformed_input",
            "schema_mismatch",
            id="wrong-shape-to-review",
        ),
        pytest.param(
            json.dumps({**json.loads(PAYLOAD), "schema_version": 2}).encode(),
            Fail,
            "unsupported_schema_version",
            "unsupported_schema_version",
            id="unsupported-schema-version-fails",
        ),
    ],
)
def test_a_payload_that_cannot_be_read_becomes_its_outcome_without_a_call(
    classifier: Any,
    payloads: Any,
    breaker: Any,
    content: Any,
    kind: type,
    reason: str | None,
    error_class: str,
) -> None:
    outcome = make_handler(classifier, payloads, breaker).one(JOB, content)
    assert type(outcome) is kind
    assert (outcome.job_id, outcome.attempt, outcome.error_class) == (JOB.id, 1, error_class)  # type: ignore[union-attr]  # kind: an outcome with an error class
    assert getattr(outcome, "reason", None) == reason
    classifier.classify.assert_not_called()
    if kind is RetryLater:  # the store failed: a transient call like any other
        breaker.record.assert_called_once_with(True)
    else:
        breaker.record.assert_not_called()


def test_a_malformed_payload_says_why_in_its_review_context(classifier: Any, payloads: Any, breaker: Any) -> None:
    outcome = make_handler(classifier, payloads, breaker).one(JOB, b"{not json")
    assert isinstance(outcome, SendToReview)
    assert outcome.context == {"malformed_reason": "invalid_json"}


# -- the circuit breaker, as the handler uses it ---------------------------------------------------


def test_transient_failures_open_the_circuit_and_later_jobs_are_parked_uncalled(classifier: Any, payloads: Any) -> None:
    classifier.classify.side_effect = TransientClassifierError("timeout")
    handler = make_handler(classifier, payloads, CircuitBreaker(window=4, threshold=0.5, min_calls=4, min_jobs=4))
    jobs = [claimed(n) for n in range(6)]
    outcomes = [handler.one(job, PAYLOAD) for job in jobs]
    assert outcomes[:4] == [RetryLater(job.id, 1, "timeout", "timeout") for job in jobs[:4]]
    assert outcomes[4:] == [
        Park(job.id, 1, "model", OUTAGE_SECONDS, "timeout", "timeout", backoff=True) for job in jobs[4:]
    ], "attempts are not burnt on a dependency that is down"
    assert classifier.classify.call_count == 4
    stop = handler.stop_reason()
    assert isinstance(stop, CircuitOpen)
    assert (stop.dependency, stop.delay_seconds) == ("model", OUTAGE_SECONDS)


def test_the_batch_in_which_the_circuit_opens_is_parked_whole(classifier: Any, payloads: Any) -> None:
    """The failed calls that opened the circuit were the outage's: parked too, attempt given back."""
    classifier.classify.side_effect = TransientClassifierError("server_error", "HTTP 503", retry_after=5)
    payloads.get_many.return_value = [PAYLOAD] * 6
    handler = make_handler(classifier, payloads, CircuitBreaker(window=4, threshold=0.5, min_calls=4))
    jobs = [claimed(n) for n in range(6)]
    assert handler.handle(jobs) == [
        Park(job.id, 1, "model", 5.0, "server_error", "HTTP 503", backoff=False) for job in jobs
    ]  # the model's Retry-After, as it is
    stop = handler.stop_reason()
    assert isinstance(stop, CircuitOpen)
    assert stop.retry_after == 5.0


def test_a_small_batch_in_a_total_outage_is_parked_whole(classifier: Any, payloads: Any, breaker: Any) -> None:
    """Five jobs never make the window rule's 20 calls: every call failing across three distinct
    jobs is the outage, and the failed ones are parked with the rest, attempt given back."""
    classifier.classify.side_effect = TransientClassifierError("server_error", "HTTP 503")
    payloads.get_many.return_value = [PAYLOAD] * 5
    handler = make_handler(classifier, payloads, breaker)
    jobs = [claimed(n) for n in range(5)]
    assert handler.handle(jobs) == [
        Park(job.id, 1, "model", OUTAGE_SECONDS, "server_error", "HTTP 503", backoff=True) for job in jobs
    ]
    assert classifier.classify.call_count == 3
    assert isinstance(handler.stop_reason(), CircuitOpen)


@pytest.mark.parametrize(
    ("jobs", "answers"),
    [
        pytest.param([claimed(0)], [TransientClassifierError("timeout")], id="one-job-may-be-the-document"),
        pytest.param(
            [claimed(n) for n in range(4)],
            [TransientClassifierError("timeout"), output(), output(), output()],
            id="one-job-fails-the-others-answer",
        ),
        pytest.param(
            [claimed(n, attempt=2) for n in range(5)],
            [TransientClassifierError("server_error")] * 5,
            id="jobs-that-failed-before",
        ),
    ],
)
def test_failures_that_may_be_the_documents_do_not_park(
    classifier: Any, payloads: Any, breaker: Any, jobs: list[ClaimedJob], answers: list[Any]
) -> None:
    classifier.classify.side_effect = answers
    payloads.get_many.return_value = [PAYLOAD] * len(jobs)
    handler = make_handler(classifier, payloads, breaker)
    assert not any(isinstance(o, Park) for o in handler.handle(jobs))
    assert handler.stop_reason() is None


def test_jobs_of_earlier_batches_that_failed_before_the_circuit_opened_are_given_back(
    classifier: Any, payloads: Any, breaker: Any
) -> None:
    classifier.classify.side_effect = TransientClassifierError("connection_error")
    payloads.get_many.return_value = [PAYLOAD]
    handler = make_handler(classifier, payloads, breaker)
    first, second = claimed(0), claimed(1)
    assert handler.handle([first]) == [RetryLater(first.id, 1, "connection_error", "connection_error")]
    assert handler.handle([second]) == [
        Park(second.id, 1, "model", OUTAGE_SECONDS, "connection_error", "connection_error", backoff=True)
    ]
    stop = handler.stop_reason()
    assert isinstance(stop, CircuitOpen)
    assert stop.give_back == {first.id: 1}


def test_an_open_circuit_parks_a_whole_batch_without_reading_it(
    mocker: MockerFixture, classifier: Any, payloads: Any
) -> None:
    open_breaker = mocker.Mock(spec=CircuitBreaker, is_open=True)
    handler = make_handler(classifier, payloads, open_breaker)
    jobs = [claimed(n) for n in range(3)]
    assert handler.handle(jobs) == [Park(job.id, 1, "model", OUTAGE_SECONDS, backoff=True) for job in jobs]
    payloads.get_many.assert_not_called()
    classifier.classify.assert_not_called()
    assert "transient classifier failures" in str(handler.stop_reason())


def test_a_batch_is_read_in_one_pass_and_answered_in_job_order(classifier: Any, payloads: Any, breaker: Any) -> None:
    jobs = [claimed(n) for n in range(4)]
    payloads.get_many.return_value = [PAYLOAD, PayloadMissing("gone"), PAYLOAD, PAYLOAD]
    classifier.classify.side_effect = [output("billing", 0.9), TransientClassifierError("timeout"), output(None, 0.1)]
    outcomes = make_handler(classifier, payloads, breaker).handle(jobs)
    payloads.get_many.assert_called_once_with([(job.payload_ref, job.content_sha256) for job in jobs])
    assert [type(o) for o in outcomes] == [Complete, SendToReview, RetryLater, SendToReview]
    assert [o.job_id for o in outcomes] == [job.id for job in jobs]


class ChunkClassifier:
    """A :class:`~triage.classifiers.base.ManyClassifier` seam: answers a claim in one pass
    (recording each pass's texts), or fails the pass when told to."""

    version = VERSION

    def __init__(self, fail_many: bool = False) -> None:
        self.fail_many = fail_many
        self.passes: list[list[str]] = []
        self.alone: list[str] = []

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        self.alone.append(request.text)
        return output("billing", 0.9)

    def classify_many(self, requests: list[ClassifyRequest]) -> list[ModelOutput]:
        if self.fail_many:
            raise RuntimeError("the pass failed")
        self.passes.append([request.text for request in requests])
        return [output("billing", 0.9) for _ in requests]

    def close(self) -> None:
        """Nothing to release."""


def test_a_classifier_that_answers_many_answers_the_claim_in_one_pass(payloads: Any, breaker: Any) -> None:
    jobs = [claimed(n) for n in range(4)]
    payloads.get_many.return_value = [PAYLOAD, PayloadMissing("gone"), PAYLOAD, b"not json"]
    chunk = ChunkClassifier()
    outcomes = make_handler(chunk, payloads, breaker).handle(jobs)
    assert chunk.passes == [[DOCUMENT.text, DOCUMENT.text]], "the readable documents, in one pass"
    assert chunk.alone == [], "no job asked alone"
    assert [type(o) for o in outcomes] == [Complete, SendToReview, Complete, SendToReview]
    assert [o.job_id for o in outcomes] == [job.id for job in jobs]


def test_a_failed_pass_leaves_each_job_to_be_asked_alone(payloads: Any, breaker: Any) -> None:
    jobs = [claimed(n) for n in range(3)]
    payloads.get_many.return_value = [PAYLOAD] * 3
    chunk = ChunkClassifier(fail_many=True)
    outcomes = make_handler(chunk, payloads, breaker).handle(jobs)
    assert chunk.alone == [DOCUMENT.text] * 3
    assert [type(o) for o in outcomes] == [Complete] * 3


def test_a_claim_is_not_answered_in_one_pass_on_a_pool_of_calls(payloads: Any, breaker: Any) -> None:
    """With concurrent calls (an HTTP model's) each job is asked on the pool, as before."""
    jobs = [claimed(n) for n in range(2)]
    payloads.get_many.return_value = [PAYLOAD] * 2
    chunk = ChunkClassifier()
    handler = make_handler(chunk, payloads, breaker, concurrency=2)
    try:
        assert [type(o) for o in handler.handle(jobs)] == [Complete] * 2
    finally:
        handler.close()
    assert chunk.passes == []
    assert len(chunk.alone) == 2


def test_a_missing_payload_base_parks_the_batch_and_stops_the_step(
    classifier: Any, payloads: Any, breaker: Any
) -> None:
    jobs = [claimed(n) for n in range(3)]
    payloads.get_many.return_value = [PAYLOAD, PayloadBaseMissing("/payloads is empty"), PAYLOAD]
    handler = make_handler(classifier, payloads, breaker)
    down = ("payload_store", OUTAGE_SECONDS, "payload_unavailable", "/payloads is empty")
    assert handler.handle(jobs) == [Park(job.id, 1, *down, backoff=True) for job in jobs], (
        "the store is down, not the jobs"
    )
    classifier.classify.assert_not_called()
    breaker.record.assert_not_called()
    stop = handler.stop_reason()
    assert isinstance(stop, CircuitOpen)
    assert "payload store" in str(stop)
    assert handler.handle([claimed(7)]) == [Park(uuid.UUID(int=8), 1, *down, backoff=True)], (
        "and stays down for the run"
    )
    payloads.get_many.assert_called_once()


@pytest.mark.parametrize(
    ("batch_size", "concurrency", "expected"),
    [
        pytest.param(500, 32, 512, id="rounded-up-to-whole-rounds"),
        pytest.param(1000, 32, 1024, id="operator-default"),
        pytest.param(512, 32, 512, id="already-whole"),
        pytest.param(1000, 1, 1000, id="sequential"),
        pytest.param(10, 32, 32, id="smaller-than-concurrency"),
        pytest.param(500, 0, 500, id="no-concurrency-given"),
    ],
)
def test_a_claim_is_whole_rounds_of_the_concurrency(batch_size: int, concurrency: int, expected: int) -> None:
    assert claim_size(batch_size, concurrency) == expected


# -- each payload is parsed once ------------------------------------------------------------------


class NoAnswers:
    """The content cache's ledger lookup with nothing reusable (the cache's own SQL is tested on
    PostgreSQL in tests/ledger)."""

    def reusable_answers(
        self, keys: Any, *, classifier_version: str, threshold: float
    ) -> tuple[set[Any], dict[Any, Any]]:
        return set(), {}


def test_each_payload_is_parsed_once_with_the_content_cache(
    classifier: Any, payloads: Any, breaker: CircuitBreaker, mocker: MockerFixture
) -> None:
    """The content cache keys a claim by each document's text, and the call reads the same
    document: one parse of each payload serves both (the llm path parsed each twice)."""
    from triage.pipeline.reuse import ContentCache

    jobs = [claimed(n) for n in range(4)]
    payloads.get_many.return_value = [PAYLOAD] * len(jobs)
    classifier.classify.return_value = output("billing", 0.9)
    parses = mocker.spy(DocumentPayload, "from_bytes")
    cache = ContentCache(NoAnswers(), VERSION, THRESHOLD)  # type: ignore[arg-type]
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(confidence_threshold=THRESHOLD), breaker, cache)
    outcomes = handler.handle(jobs)
    assert [type(o) for o in outcomes] == [Complete] * len(jobs)
    assert parses.call_count == len(jobs)


def test_a_handled_claim_leaves_nothing_of_its_jobs_in_the_content_cache(
    classifier: Any, payloads: Any, breaker: CircuitBreaker
) -> None:
    """The cache keeps the answers it learned, not the per-job lookups of the claims it handled:
    ``forget`` dropped those of a claim's last job only, so a long try's lookups grew claim by claim
    and a forgotten job still found its input's answer."""
    from triage.pipeline.reuse import ContentCache

    cache = ContentCache(NoAnswers(), VERSION, THRESHOLD)  # type: ignore[arg-type]
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(confidence_threshold=THRESHOLD), breaker, cache)
    classifier.classify.return_value = output("billing", 0.9)
    for claim in range(3):
        jobs = [claimed(claim * 10 + n) for n in range(4)]
        payloads.get_many.return_value = [PAYLOAD] * len(jobs)
        handler.handle(jobs)
        cache.forget(jobs)
        assert [cache.answer(job) for job in jobs] == [None] * len(jobs)
    assert (cache._keys, cache._eligible, cache._found) == ({}, set(), {})
