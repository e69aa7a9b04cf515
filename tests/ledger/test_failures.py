"""The named failure cases: each on the real database with the real store, steps and sinks.

1 a document or event delivered twice · 2 a worker stops after an external action, before
recording it · 3 the database update succeeds while event publication is interrupted · 4 an old
outcome arrives after the job has advanced · 5 an unsupported schema version · 6 an external
call times out although the provider completed it · 7 a retry begins while another worker
still holds a valid lease · 8 reconciliation finds a job whose state conflicts with its external
outcome.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from triage.adapters.http_actions import WebhookLabelAction
from triage.classifiers import Taxonomy, build_classifier
from triage.contracts.documents import DocumentPayload
from triage.contracts.events import UnsupportedSchemaVersion, WorkEvent, parse_event
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.backoff import RetryPolicy
from triage.jobs.vocabulary.errors import LeaseLost
from triage.jobs.vocabulary.models import Complete, LabelWrite, NewJob, RetryLater, SendToReview
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.persist import PersistHandler
from triage.pipeline.publish import JsonlEventSink, publish_all
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import CircuitOpen, RunSettings, run_step
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage.sources.synthetic import SyntheticSource
from triage_tools.drill.invariants import check_invariants

DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = "failures"
FAST = RetryPolicy(base_seconds=0.01, cap_seconds=0.02)


@pytest.fixture
def fast(engine: sa.Engine) -> JobStore:
    return JobStore(engine, retry_policy=FAST)


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


def q(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def register(store: JobStore, payloads: PayloadStore, n: int, *, duplicate_rate: float = 0.0) -> None:
    classifier = build_classifier("keyword", taxonomy=Taxonomy.load())
    retrieve(
        store,
        SyntheticSource(n, seed=3, duplicate_rate=duplicate_rate),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=3,
    )


def classify(store: JobStore, payloads: PayloadStore, *, separate_persist: bool = False) -> None:
    handler = ClassifyHandler(
        build_classifier("keyword", taxonomy=Taxonomy.load()), payloads, ClassifySettings(0.0, 1, separate_persist)
    )
    try:
        run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="w1", retry_soon_seconds=5))
    finally:
        handler.close()


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_1_a_document_delivered_twice_is_one_job_one_label_one_event(
    fast: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    register(fast, payloads, 200, duplicate_rate=0.3)  # duplicates inside one delivery
    register(fast, payloads, 200, duplicate_rate=0.3)  # and the whole day delivered again
    classify(fast, payloads)
    assert q(fast, "SELECT count(*) FROM triage.jobs") == 200
    completed = q(fast, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'")
    assert completed > 150
    assert q(fast, "SELECT count(*) FROM triage.document_labels") == completed
    assert q(fast, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.completed'") == completed
    assert q(fast, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.registered'") == 200
    sink = JsonlEventSink(tmp_path / "events.jsonl")
    publish_all(fast, sink)
    with fast.engine.begin() as conn:  # the same events offered again (a relay that lost its marks)
        conn.execute(sa.text("UPDATE triage.outbox SET txid = pg_current_xact_id()::text::bigint"))
    publish_all(fast, sink)
    ids = [json.loads(line)["event_id"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    in_review = q(fast, "SELECT count(*) FROM triage.jobs WHERE status = 'manual_review'")
    assert q(fast, "SELECT count(*) FROM triage.outbox WHERE event_type = 'job.needs_review'") == in_review
    assert len(ids) == len(set(ids)) == 200 + completed + in_review


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_2_a_worker_that_stops_after_the_external_action_causes_one_effect(
    fast: JobStore, payloads: PayloadStore
) -> None:
    register(fast, payloads, 20)
    classify(fast, payloads, separate_persist=True)
    waiting = q(fast, "SELECT count(*) FROM triage.jobs WHERE step = 'persist'")
    assert waiting > 10
    with FakeProvider() as provider:
        action = WebhookLabelAction(provider.url, timeout_s=5)
        # The worker runs the actions of its batch, then dies before recording the outcomes.
        claim = fast.claim(batch_key=BATCH, step="persist", limit=100, lease_seconds=30, owner="doomed")
        PersistHandler(fast, action).handle(claim.jobs)
        with fast.engine.begin() as conn:
            conn.execute(
                sa.text(
                    "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second' WHERE lease_owner = 'doomed'"
                )
            )
        assert fast.release_expired_leases().retrying == waiting  # reconciliation returns the work
        with fast.engine.begin() as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'"))
        run_step(fast, PersistHandler(fast, action), batch_key=BATCH, settings=RunSettings(owner="w2"))
        action.close()
    assert q(fast, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == waiting
    assert sum(provider.requests.values()) == 2 * waiting  # asked twice …
    assert len(provider.effects) == waiting  # … and took effect once per idempotency key
    assert q(fast, "SELECT count(*) FROM triage.job_events WHERE to_status = 'completed'") == waiting


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_3_an_interrupted_publication_is_delivered_later_exactly_once(
    fast: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    register(fast, payloads, 50)
    classify(fast, payloads)
    log = tmp_path / "events.jsonl"

    class Interrupted(Exception):
        pass

    class DiesAfterWriting(JsonlEventSink):
        def publish(self, events: Sequence[WorkEvent]) -> None:
            super().publish(events)
            raise Interrupted  # written, never marked: the relay's transaction rolls back

    events = q(fast, "SELECT count(*) FROM triage.outbox")
    with pytest.raises(Interrupted):
        publish_all(fast, DiesAfterWriting(log), batch=30)
    assert (
        q(
            fast,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == events
    )
    assert len(log.read_text().splitlines()) == 30  # the first batch reached the sink
    publish_all(fast, JsonlEventSink(log))  # a new relay process, later
    ids = [json.loads(line)["event_id"] for line in log.read_text().splitlines()]
    assert len(ids) == len(set(ids)) == events
    assert (
        q(
            fast,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 0
    )


def test_4_an_old_outcome_after_the_job_advanced_changes_nothing(fast: JobStore, payloads: PayloadStore) -> None:
    register(fast, payloads, 1)
    first = fast.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=30, owner="slow")
    job = first.jobs[0]
    with fast.engine.begin() as conn:  # the slow worker's lease runs out; another takes over
        conn.execute(sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 second'"))
    fast.release_expired_leases()
    with fast.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now()"))
    second = fast.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=30, owner="fresh")
    fast.record(second, [Complete(job.id, 2, LabelWrite("refund_request", 0.9, "v"))])
    before = q(fast, "SELECT count(*) FROM triage.job_events")
    with pytest.raises(LeaseLost):  # the first worker's late outcome for attempt 1
        fast.record(first, [RetryLater(job.id, 1, "timeout")])
    assert q(fast, "SELECT count(*) FROM triage.job_events") == before
    assert q(fast, "SELECT status::text || ':' || attempt FROM triage.jobs") == "completed:2"
    assert q(fast, "SELECT label FROM triage.document_labels") == "refund_request"


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_5_an_unsupported_schema_version_is_routed_not_misread(fast: JobStore, payloads: PayloadStore) -> None:
    event = {
        "event_id": "7c9e6679-7425-40de-944b-e07fc1f90ae7",
        "job_id": "7c9e6679-7425-40de-944b-e07fc1f90ae8",
        "event_type": "job.completed",
        "schema_version": 2,
        "attempt": 1,
        "occurred_at": "2026-11-01T00:00:00+00:00",
        "correlation_id": "c",
        "payload_ref": "file:///x",
    }
    with pytest.raises(UnsupportedSchemaVersion):
        parse_event(json.dumps(event))
    future = DocumentPayload(external_id="doc-v2", subject="s", body="b", received_at=DAY).to_bytes()
    future = future.replace(b'"schema_version":1', b'"schema_version":2')
    digest, ref = payloads.put(future)
    version = build_classifier("keyword", taxonomy=Taxonomy.load()).version  # the version classify() claims
    fast.register(
        [NewJob(f"jsonl/6:doc-v2/{digest}/v", "jsonl", "doc-v2", digest, ref, version)],
        batch_key=BATCH,
        step="classify",
        max_attempts=3,
    )
    classify(fast, payloads)
    assert q(fast, "SELECT status::text || ':' || status_reason FROM triage.jobs") == (
        "terminal_failed:unsupported_schema_version"
    )


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_6_a_timeout_after_the_provider_completed_is_retried_without_a_second_effect(
    engine: sa.Engine, payloads: PayloadStore
) -> None:
    patient = JobStore(engine, retry_policy=RetryPolicy(base_seconds=600, cap_seconds=600))
    register(patient, payloads, 5)
    classify(patient, payloads, separate_persist=True)
    waiting = q(patient, "SELECT count(*) FROM triage.jobs WHERE step = 'persist'")
    with FakeProvider() as provider:
        provider.delay_after_effect_s = 0.6  # applies the effect, answers after the client gave up
        action = WebhookLabelAction(provider.url, timeout_s=0.2)
        run = RunSettings(owner="w", retry_soon_seconds=0)
        # Every action of the try timed out: from the caller's side the provider is down, so
        # the batch is parked on the outage (no attempt spent) rather than retried one by one.
        with pytest.raises(CircuitOpen):
            run_step(patient, PersistHandler(patient, action), batch_key=BATCH, settings=run)
        assert q(patient, "SELECT count(*) FROM triage.jobs WHERE status_reason = 'outage:label_provider'") == waiting
        assert len(provider.effects) == waiting  # the provider did complete every one
        provider.delay_after_effect_s = 0.0
        with engine.begin() as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))
        run_step(patient, PersistHandler(patient, action), batch_key=BATCH, settings=run)
        action.close()
    assert q(patient, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == waiting
    assert sorted(provider.requests.values()) == [2] * waiting
    assert len(provider.effects) == waiting


def test_7_a_retry_while_another_worker_holds_a_valid_lease_takes_nothing(
    fast: JobStore, payloads: PayloadStore
) -> None:
    register(fast, payloads, 10)
    holder = fast.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="holder")
    assert len(holder.jobs) == 10
    retry = fast.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=60, owner="retry")
    assert len(retry.jobs) == 0
    assert fast.release_expired_leases().retrying == 0  # a live lease is not reconciliation's
    assert fast.send_batch_to_review(BATCH, reason="airflow_task_failed", error="x", owner_prefix="retry/") == 0
    fast.record(holder, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v")) for j in holder.jobs])
    assert q(fast, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == 10
    assert q(fast, "SELECT count(DISTINCT actor) FROM triage.job_events WHERE to_status = 'running'") == 1


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_8_reconciliation_reports_a_state_that_conflicts_with_the_external_outcome_and_guesses_nothing(
    fast: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    register(fast, payloads, 30)
    doubtful = fast.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=30, owner="w0")
    fast.record(doubtful, [SendToReview(doubtful.jobs[0].id, 1, "inconclusive")])
    classify(fast, payloads)
    in_review = str(doubtful.jobs[0].id)
    lost = str(q(fast, "SELECT min(job_id::text) FROM triage.document_labels"))
    with fast.engine.begin() as conn:
        # The business output disagrees with the ledger, from outside the pipeline: a restore lost
        # one completed job's label, and a downstream writer labelled the document under review.
        conn.execute(sa.text("DELETE FROM triage.document_labels WHERE job_id = CAST(:id AS uuid)"), {"id": lost})
        conn.execute(
            sa.text(
                "INSERT INTO triage.document_labels (source, external_id, label, confidence, classifier_version,"
                " content_sha256, job_id, job_created_at) SELECT source, external_id, 'billing', 0.99, classifier_version,"
                " content_sha256, id, created_at FROM triage.jobs WHERE id = CAST(:id AS uuid)"
            ),
            {"id": in_review},
        )
    states = "SELECT string_agg(id::text || status::text || attempt, ',' ORDER BY id) FROM triage.jobs"
    before = (
        q(fast, states),
        q(fast, "SELECT count(*) FROM triage.job_events"),
        q(fast, "SELECT count(*) FROM triage.manual_review"),
    )
    with fast.engine.connect() as conn:
        judge = {i.name: i.violations for i in check_invariants(conn, [BATCH])}
    assert judge["labels_match_completed"] == 2  # the drill's judge sees both as well

    now = ReconcileParams(grace_seconds=0)
    for _ in range(2):  # found every time, repaired never: which side is right is a human's call
        outcome = reconcile(fast, now, reports_dir=tmp_path / "reports")
        conflicts = {c.check: c.job_ids for r in outcome.results for c in r.conflicts}
        assert conflicts == {"completed_without_label": (lost,), "label_without_completed_job": (in_review,)}
        assert not [repair for r in outcome.results for repair in r.repairs]
        assert lost in outcome.markdown
        assert in_review in outcome.markdown
        assert (
            q(fast, states),
            q(fast, "SELECT count(*) FROM triage.job_events"),
            q(fast, "SELECT count(*) FROM triage.manual_review"),
        ) == before


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_retried_task_takes_back_what_its_killed_earlier_try_held_and_nothing_of_a_sibling(
    fast: JobStore, payloads: PayloadStore
) -> None:
    register(fast, payloads, 30)
    fast.register(
        [NewJob("other-batch-key", "s", "other", "0" * 64, "file:///x", "v")],
        batch_key="other",
        step="classify",
        max_attempts=3,
    )
    elsewhere = fast.claim(batch_key="other", step="classify", limit=1, lease_seconds=600, owner="other/0/try1")
    with fast.engine.begin() as conn:  # expired, but another batch's: reconciliation's, not this step's
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE batch_key = 'other'")
        )
    task, sibling = "classify_documents/run1/classify/0/", "classify_documents/run1/classify/1/"
    killed = fast.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=600, owner=task + "try1")
    busy = fast.claim(batch_key=BATCH, step="classify", limit=10, lease_seconds=600, owner=sibling + "try1")
    handler = ClassifyHandler(
        build_classifier("keyword", taxonomy=Taxonomy.load()), payloads, ClassifySettings(0.0, 1, False)
    )
    run_step(
        fast,
        handler,
        batch_key=BATCH,
        settings=RunSettings(owner=task + "try2", earlier_tries_of=task, retry_soon_seconds=5),
    )
    handler.close()
    held = "SELECT count(*) FROM triage.jobs WHERE status = 'running' AND lease_owner = :owner"
    assert q(fast, held, owner=task + "try1") == 0  # the dead try's ten were taken back and done
    assert q(fast, held, owner=sibling + "try1") == 10  # a live sibling's lease is its own
    taken_back = [j.id for j in killed.jobs]
    with fast.engine.connect() as conn:
        moves = conn.execute(
            sa.text(
                "SELECT to_status::text, actor FROM triage.job_events WHERE job_id = ANY(:ids)"
                " AND from_status = 'running' ORDER BY at, to_status"
            ),
            {"ids": taken_back},
        ).all()
    assert {m.to_status for m in moves if m.actor == task + "try2"} >= {"retryable_failed", "completed"}
    assert len(busy.jobs) == 10
    assert fast.get_status(elsewhere.jobs[0].id) == "running"
