"""Model answers against the fake OpenAI-compatible server on loopback (real HTTP) and a real
PostgreSQL: the output mode recorded with each classification, a provider that refuses
``json_schema``, and the content cache (an accepted answer reused for the same content and
classifier version, never against a reviewer)."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from tests.ledger.helpers import classify_try, document, llm_classifier, register_documents
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifySettings
from triage.pipeline.reuse import ContentCache
from triage.pipeline.steps import DependencyMisconfigured, RunSettings, StepReport

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = Taxonomy.load()


def register(
    store: JobStore, payloads: PayloadStore, version: str, docs: dict[str, str], *, batch: str = BATCH
) -> dict[str, uuid.UUID]:
    """One job per ``external id -> body``, each received at another minute: equal bodies are
    equal classifier input, though their payloads (and ``content_sha256``) differ."""
    source_docs = [
        document(external_id, body, subject="Ticket", received_at=datetime(2026, 11, 1, 9, minute, tzinfo=UTC))
        for minute, (external_id, body) in enumerate(docs.items())
    ]
    register_documents(store, payloads, source_docs, version, batch_key=batch)
    with store.engine.connect() as conn:
        found = conn.execute(sa.text("SELECT external_id, id FROM triage.jobs WHERE batch_key = :b"), {"b": batch})
        return {r.external_id: r.id for r in found if r.external_id in docs}


def classify(
    store: JobStore,
    classifier: OpenAICompatibleClassifier,
    payloads: PayloadStore,
    *,
    cache: bool = True,
    threshold: float = 0.7,
    batch: str = BATCH,
    concurrency: int = 4,
    batch_size: int = 50,
) -> tuple[StepReport, ContentCache | None]:
    reuse = ContentCache(store, classifier.version, threshold) if cache else None
    settings = RunSettings(owner="answers-test", batch_size=batch_size, lease_seconds=60, retry_soon_seconds=0)
    settled = ClassifySettings(threshold, concurrency)
    return classify_try(store, classifier, payloads, settings, batch_key=batch, classify=settled, cache=reuse), reuse


def rows(store: JobStore, sql: str, **params: object) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql), params).all())


def classification_of(store: JobStore, job_id: uuid.UUID) -> sa.Row:
    [row] = rows(store, "SELECT * FROM triage.classifications WHERE job_id = :j", j=job_id)
    return row


# -- structured output -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["json_schema", "json_object"])
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_each_classification_records_its_output_mode(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, mode: str
) -> None:
    classifier = llm_classifier(server, response_format=mode)
    ids = register(store, payloads, classifier.version, {"A": "charged twice"})
    classify(store, classifier, payloads, cache=False)
    row = classification_of(store, ids["A"])
    assert (row.outcome, row.label, row.output_mode) == ("accepted", "billing", mode)
    assert server.requests[0]["response_format"]["type"] == mode


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_provider_refusing_json_schema_stops_the_step_and_spends_nothing(
    store: JobStore, payloads: PayloadStore
) -> None:
    with FakeOpenAIServer(responder=fixed_label("billing"), refuse_json_schema=True) as refusing:
        classifier = llm_classifier(refusing)
        register(store, payloads, classifier.version, {"A": "one", "B": "two", "C": "three"})
        with pytest.raises(DependencyMisconfigured, match="structured_output_unsupported"):
            classify(store, classifier, payloads, cache=False, concurrency=1)
        assert refusing.request_count == 1  # the first refusal stops the step
    # Released, attempt given back, nothing in review: the connection is wrong, not the documents.
    jobs = rows(store, "SELECT status, attempt FROM triage.jobs")
    assert [tuple(j) for j in jobs] == [("queued", 0)] * 3
    assert rows(store, "SELECT * FROM triage.manual_review") == []
    assert rows(store, "SELECT * FROM triage.classifications") == []


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_auto_completes_on_a_provider_refusing_json_schema_and_records_json_object(
    store: JobStore, payloads: PayloadStore
) -> None:
    with FakeOpenAIServer(responder=fixed_label("billing"), refuse_json_schema=True) as refusing:
        classifier = llm_classifier(refusing, response_format="auto")
        ids = register(store, payloads, classifier.version, {"A": "one", "B": "two", "C": "three"})
        classify(store, classifier, payloads, cache=False, concurrency=1)
        modes = [r["response_format"]["type"] for r in refusing.requests]
    assert modes == ["json_schema", "json_object", "json_object", "json_object"]
    assert {classification_of(store, i).output_mode for i in ids.values()} == {"json_object"}
    assert {r.status for r in rows(store, "SELECT status FROM triage.jobs")} == {"completed"}


# -- the content cache ---------------------------------------------------------------------------


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_repeated_content_is_answered_once_and_each_job_completes_on_its_own(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    texts = {"charged twice", "other"}
    ids = register(
        store, payloads, classifier.version, {"A": "charged twice", "B": "charged twice", "C": "other", "D": "other"}
    )
    hashes = {r.content_sha256 for r in rows(store, "SELECT content_sha256 FROM triage.jobs")}
    assert len(hashes) == 4  # four payloads (each its own id and time), two classifier inputs
    _, cache = classify(store, classifier, payloads)
    assert server.request_count == 2  # one call per distinct content
    assert cache is not None
    assert cache.reused == 2
    labels = {r.external_id: (r.label, r.job_id) for r in rows(store, "SELECT * FROM triage.document_labels")}
    assert labels == {name: ("billing", job_id) for name, job_id in ids.items()}
    by_job = {r.job_id: r for r in rows(store, "SELECT * FROM triage.classifications")}
    reused = [r for r in by_job.values() if r.reused_job_id is not None]
    assert len(reused) == 2
    for row in reused:
        source = by_job[row.reused_job_id]
        assert source.reused_job_id is None  # an answer of the model itself
        assert (row.reused_attempt, row.label, row.confidence) == (source.attempt, source.label, source.confidence)
        assert row.input_sha256 == source.input_sha256
        assert row.input_sha256 in {hashlib.sha256(f"Ticket\n\n{body}".encode()).hexdigest() for body in texts}
        assert (row.prompt_tokens, row.completion_tokens, float(row.cost_usd)) == (0, 0, 0.0)
        assert row.output_mode == "json_schema"
    # Each job went through the state machine with its own events.
    events = rows(store, "SELECT job_id, to_status FROM triage.job_events WHERE to_status = 'completed'")
    assert {e.job_id for e in events} == set(ids.values())


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_later_run_answers_repeated_content_from_the_ledger_without_a_call(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    first = register(store, payloads, classifier.version, {"A": "where is my parcel"})
    classify(store, classifier, payloads)
    assert server.request_count == 1
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    second = register(store, payloads, classifier.version, {"A2": "where is my parcel"}, batch=later)
    fresh = llm_classifier(server)  # another worker: nothing in memory
    classify(store, fresh, payloads, batch=later)
    assert server.request_count == 1  # zero calls for the repeat
    row = classification_of(store, second["A2"])
    assert (row.reused_job_id, row.reused_attempt, row.label) == (first["A"], 1, "billing")


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_answer_is_not_reused_across_classifier_versions(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    old = llm_classifier(server, prompt_version="p1")
    register(store, payloads, old.version, {"A": "same text"})
    classify(store, old, payloads)
    new = llm_classifier(server, prompt_version="p2")  # a prompt change is a new version: new work
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    ids = register(store, payloads, new.version, {"B": "same text"}, batch=later)
    classify(store, new, payloads, batch=later)
    assert server.request_count == 2
    assert classification_of(store, ids["B"]).reused_job_id is None


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_an_answer_below_this_runs_threshold_sends_its_repeat_to_review_without_a_call(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    server.responder = fixed_label("billing", 0.75)
    classifier = llm_classifier(server)
    first = register(store, payloads, classifier.version, {"A": "same text"})
    classify(store, classifier, payloads, threshold=0.7)
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    ids = register(store, payloads, classifier.version, {"B": "same text"}, batch=later)
    _, cache = classify(store, llm_classifier(server), payloads, threshold=0.8, batch=later)
    # The same input to the same version answers 0.75 again: decided afresh at 0.8, doubtful.
    assert server.request_count == 1
    assert cache is not None
    assert cache.reused == 1
    row = classification_of(store, ids["B"])
    assert (row.outcome, row.confidence, row.reused_job_id) == ("inconclusive", 0.75, first["A"])
    [review] = rows(store, "SELECT * FROM triage.manual_review WHERE job_id = :j", j=ids["B"])
    assert review.reason == "inconclusive"
    assert review.context["reused_job_id"] == str(first["A"])
    assert review.context["reused_attempt"] == 1
    assert str(first["A"]) in review.last_error


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_doubtful_answer_is_reused_within_a_claim_and_an_accepted_one_wins_over_it(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    server.enqueue(Reply.ok("billing", 0.3))  # A: doubtful; B, its repeat, takes that answer
    ids = register(store, payloads, classifier.version, {"A": "same text", "B": "same text"})
    classify(store, classifier, payloads)
    assert server.request_count == 1
    statuses = {r.id: r.status for r in rows(store, "SELECT id, status FROM triage.jobs")}
    assert statuses == {ids["A"]: "manual_review", ids["B"]: "manual_review"}
    assert classification_of(store, ids["B"]).reused_job_id == ids["A"]
    # A reviewer requeues A: the model is asked again and accepts; that answer is the entry now.
    store.review.resolve_with_requeue(ids["A"], actor="alice", note="ask again")
    classify(store, llm_classifier(server), payloads)
    assert server.request_count == 2
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    ids |= register(store, payloads, classifier.version, {"C": "same text"}, batch=later)
    classify(store, llm_classifier(server), payloads, batch=later)
    assert server.request_count == 2
    row = classification_of(store, ids["C"])
    assert (row.outcome, row.reused_job_id, row.reused_attempt) == ("accepted", ids["A"], 2)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_repeat_of_a_rejected_answer_is_asked_itself(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    server.enqueue(Reply.ok("astrology"))  # the first call: outside the taxonomy
    ids = register(store, payloads, classifier.version, {"A": "same text", "B": "same text"})
    classify(store, classifier, payloads, concurrency=1)
    assert server.request_count == 2
    outcomes = {r.job_id: r.outcome for r in rows(store, "SELECT * FROM triage.classifications")}
    assert sorted(outcomes.values()) == ["accepted", "rejected"]
    assert all(c.reused_job_id is None for c in rows(store, "SELECT * FROM triage.classifications"))
    assert set(outcomes) == set(ids.values())


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_cache_never_answers_for_content_a_reviewer_labelled(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    # A's answer is doubtful: a reviewer labels it refund_request.
    server.enqueue(Reply.ok("billing", 0.3))
    ids = register(store, payloads, classifier.version, {"A": "money back please"})
    classify(store, classifier, payloads)
    store.review.resolve_with_label(ids["A"], "refund_request", actor="alice", taxonomy_names=TAXONOMY.names)
    # The same content under another id: the model says billing, accepted (an entry exists now).
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    ids |= register(store, payloads, classifier.version, {"B": "money back please"}, batch=later)
    classify(store, llm_classifier(server), payloads, batch=later)
    # And again: a cached "billing" would contradict the reviewer about this content, so the
    # model is asked instead (a reviewer's label is never reused either).
    latest = "2026-11-03T00:00:00+00:00/2026-11-04T00:00:00+00:00"
    ids |= register(store, payloads, classifier.version, {"C": "money back please"}, batch=latest)
    classify(store, llm_classifier(server), payloads, batch=latest)
    assert server.request_count == 3
    assert classification_of(store, ids["C"]).reused_job_id is None
    labels = {r.external_id: r.label for r in rows(store, "SELECT * FROM triage.document_labels")}
    assert labels == {"A": "refund_request", "B": "billing", "C": "billing"}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_job_a_reviewer_requeued_is_asked_again_not_answered_from_the_cache(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    classifier = llm_classifier(server)
    server.enqueue(Reply.ok("billing", 0.3))  # A: doubtful, to review
    ids = register(store, payloads, classifier.version, {"A": "same text"})
    classify(store, classifier, payloads)
    later = "2026-11-02T00:00:00+00:00/2026-11-03T00:00:00+00:00"
    server.responder = fixed_label("billing", 0.92)
    ids |= register(store, payloads, classifier.version, {"B": "same text"}, batch=later)
    classify(store, llm_classifier(server), payloads, batch=later)  # B: A's doubtful answer, to review
    assert server.request_count == 1
    assert classification_of(store, ids["B"]).reused_job_id == ids["A"]
    store.review.resolve_with_requeue(ids["A"], actor="alice", note="ask again")
    classify(store, llm_classifier(server), payloads)
    assert server.request_count == 2  # the reviewer asked for the model, not the cache
    [again] = rows(store, "SELECT * FROM triage.classifications WHERE job_id = :j AND attempt = 2", j=ids["A"])
    assert (again.outcome, again.reused_job_id) == ("accepted", None)
