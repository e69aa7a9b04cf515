"""Batch mode against the fake OpenAI-compatible server's batch interface on loopback (real HTTP)
and a real PostgreSQL: jobs wait while their batch runs, answers are taken per job (partial
results), a lost batch sends its jobs back to be asked, and a resubmission adopts the batch."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from triage.classifiers.batch_api import BatchClient
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.jobs.store import JobStore
from triage.jobs.store.batches import BatchLedger
from triage.payloads import PayloadStore
from triage.pipeline.batch_mode import collect, given_answers, submission_key, submit
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import to_new_jobs
from triage.pipeline.steps import RunSettings, run_step
from triage.sources.base import SourceDocument

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
TAXONOMY = Taxonomy.load()


def responder(body: dict) -> Reply:
    text = body["messages"][1]["content"]
    if text.endswith("broken"):
        return Reply.status_only(500)
    if text.endswith("unsure"):
        return Reply.ok("billing", 0.2)
    return Reply.ok("billing", 0.9)


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer(responder=responder) as fake:
        yield fake


@pytest.fixture
def payloads(tmp_path: Path) -> PayloadStore:
    return PayloadStore(tmp_path / "payloads")


def llm(server: FakeOpenAIServer) -> OpenAICompatibleClassifier:
    return OpenAICompatibleClassifier(base_url=server.base_url, api_key="k", model="fake", taxonomy=TAXONOMY)


def register(store: JobStore, payloads: PayloadStore, version: str, bodies: list[str]) -> list[uuid.UUID]:
    docs = [
        SourceDocument(
            "test",
            f"doc-{i}",
            DocumentPayload(
                external_id=f"doc-{i}", subject="Ticket", body=body, received_at=datetime(2026, 11, 1, tzinfo=UTC)
            ).to_bytes(),
        )
        for i, body in enumerate(bodies)
    ]
    store.register(to_new_jobs(docs, payloads, version), batch_key=BATCH, step="classify", max_attempts=3)
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT id FROM triage.jobs ORDER BY external_id")).scalars())


def jobs(store: JobStore) -> list[sa.Row]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text("SELECT * FROM triage.jobs ORDER BY external_id")).all())


def classify(store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, ledger: BatchLedger) -> None:
    handler = ClassifyHandler(llm(server), payloads, ClassifySettings(0.7, 2), given=given_answers(ledger))
    try:
        run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="classify", retry_soon_seconds=0))
    finally:
        handler.close()


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_jobs_wait_on_their_batch_and_take_its_answers_per_job(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    ids = register(store, payloads, client.classifier.version, ["a", "b", "c broken", "d unsure"])
    [key] = submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit")
    assert key == submission_key(BATCH, ids)
    assert {(j.status, j.status_reason, j.attempt) for j in jobs(store)} == {("waiting", "outage:batch", 0)}
    assert server.request_count == 0  # nothing interactive
    assert submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit") == []  # all waiting
    assert collect(ledger, client, batch_key=BATCH, actor="collect").running == 1  # still in progress
    done = collect(ledger, client, batch_key=BATCH, actor="collect")
    assert (done.collected, done.answers, done.due) == (1, 3, 4)
    server.responder = fixed_label("billing")  # asked interactively, "c broken" is answered
    classify(store, server, payloads, ledger)
    # Three answers taken from the batch; the request that failed inside it is asked once.
    assert server.request_count == 1
    statuses = [(j.status, j.attempt) for j in jobs(store)]
    assert statuses == [("completed", 1), ("completed", 1), ("completed", 1), ("manual_review", 1)]
    with store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT job_id, output_mode, prompt_tokens FROM triage.classifications")).all()
    assert len(rows) == 4
    assert all(r.output_mode == "json_schema" and r.prompt_tokens == 120 for r in rows)
    client.close()


@pytest.mark.parametrize(("how", "kept"), [("failed", 0), ("gone", 0), ("expired", 2)])
@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_batch_the_provider_loses_sends_its_jobs_back_to_be_asked(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, how: str, kept: int
) -> None:
    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    register(store, payloads, client.classifier.version, ["a", "b", "c", "d"])
    submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit")
    [batch_id] = server.batches.batches
    server.batches.lose(batch_id, how, keep=kept)
    result = collect(ledger, client, batch_key=BATCH, actor="collect")
    assert (result.lost, result.collected, result.answers, result.due) == (
        (0, 1, kept, 4) if how == "expired" else (1, 0, 0, 4)
    )
    classify(store, server, payloads, ledger)
    assert server.request_count == 4 - kept  # what the batch did not answer is asked interactively
    assert [(j.status, j.attempt) for j in jobs(store)] == [("completed", 1)] * 4  # no attempt lost, no review
    client.close()


def test_a_resubmission_after_a_crash_adopts_the_batch_the_provider_accepted(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    ids = register(store, payloads, client.classifier.version, ["a", "b"])
    key = submission_key(BATCH, ids)
    # A worker wrote its row and the provider accepted the batch; the worker died before it
    # recorded the provider's id or parked the jobs (their lease then ran out: queued again).
    ledger.open_submission(key, BATCH, client.classifier.version, [(i, 1) for i in ids])
    accepted = client.submit([(f"{i}:1", "x") for i in ids], key)
    # The jobs are in a submission still open: they wait for it, and are not submitted again.
    assert submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit-2") == []
    assert {(j.status, j.status_reason) for j in jobs(store)} == {("waiting", "outage:batch")}
    assert collect(ledger, client, batch_key=BATCH, actor="collect").running == 1  # found by its name
    assert server.batches.created == 1  # adopted, not paid twice
    assert [s.provider_batch_id for s in ledger.open_batches(BATCH)] == [accepted]
    assert [s.key for s in ledger.open_batches(BATCH)] == [key]
    client.close()


def test_the_same_jobs_submitted_after_their_batch_finished_make_a_new_batch(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    ids = register(store, payloads, client.classifier.version, ["a", "b"])
    [first] = submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit")
    [batch_id] = server.batches.batches
    server.batches.lose(batch_id, "failed")
    collect(ledger, client, batch_key=BATCH, actor="collect")  # lost: the jobs are due, queued by a claim
    store.resume_parked(BATCH, "classify", actor="test", classifier_version=client.classifier.version)
    [second] = submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit-again")
    assert second == f"{first}.1" == f"{submission_key(BATCH, ids)}.1"
    assert server.batches.created == 2
    assert [s.key for s in ledger.open_batches(BATCH)] == [second]
    client.close()


@pytest.mark.parametrize(("status", "transient"), [(404, False), (401, False), (503, True)])
def test_a_submission_the_provider_does_not_take_gives_the_claim_back(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore, status: int, transient: bool
) -> None:
    """No batch interface there (404), a key that may not use it (401): permanent; a 503:
    transient. Either way the claimed jobs are queued again with no attempt spent (not left
    running under the claim's lease), and a later submission of them goes through."""
    from triage.classifiers.base import ClassifierError

    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    register(store, payloads, client.classifier.version, ["a", "b", "c"])
    server.batches.refuse = status
    with pytest.raises(ClassifierError) as caught:
        submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit")
    assert caught.value.transient is transient
    assert caught.value.error_class == ("batch_api_error" if transient else "batch_interface_unavailable")
    assert {(j.status, j.attempt, j.lease_owner) for j in jobs(store)} == {("queued", 0, None)}
    server.batches.refuse = None
    [key] = submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit-again")
    assert server.batches.created == 1
    assert {(j.status, j.status_reason) for j in jobs(store)} == {("waiting", "outage:batch")}
    assert [s.key for s in ledger.open_batches(BATCH)] == [key]
    client.close()


@pytest.mark.own_database  # a lease runs out in time
def test_a_batch_adopted_after_the_first_lease_ran_out_answers_the_next_attempt(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    """A submitter died after the provider took its batch and before it parked the jobs; their
    lease ran out (that attempt counted) and the next submission adopts the batch at the next
    attempt. Its answers, asked at the first attempt, still answer the jobs: no call paid twice."""
    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    ids = register(store, payloads, client.classifier.version, ["a", "b"])
    claim = store.claim(
        batch_key=BATCH,
        step="classify",
        limit=10,
        lease_seconds=0.1,
        owner="dead",
        classifier_version=client.classifier.version,
    )
    key = submission_key(BATCH, ids)
    ledger.open_submission(key, BATCH, client.classifier.version, [(j.id, j.attempt) for j in claim.jobs])
    client.submit([(f"{j.id}:{j.attempt}", "x") for j in claim.jobs], key)  # accepted; then the worker died
    time.sleep(0.2)
    assert store.release_expired_leases(batch_key=BATCH).retrying == 2  # attempt 1 spent
    while submit(store, ledger, client, payloads, batch_key=BATCH, owner="submit-2") == [] and any(
        j.status == "retryable_failed" for j in jobs(store)
    ):
        time.sleep(0.2)  # claimed as their retry's backoff passes; parked on the open batch again
    assert {(j.status, j.status_reason) for j in jobs(store)} == {("waiting", "outage:batch")}
    assert server.batches.created == 1  # not submitted again
    collect(ledger, client, batch_key=BATCH, actor="collect")  # found by its name, still running
    assert collect(ledger, client, batch_key=BATCH, actor="collect").answers == 2
    classify(store, server, payloads, ledger)
    assert server.request_count == 0  # the batch's answers, taken at attempt 2
    assert [(j.status, j.attempt) for j in jobs(store)] == [("completed", 2)] * 2
    client.close()


def test_a_submission_another_run_is_writing_is_left_to_it(
    store: JobStore, server: FakeOpenAIServer, payloads: PayloadStore
) -> None:
    """Two runs of one data interval (a scheduled run waiting on its batch, a run triggered for
    the same day): the second must not settle the first's submission as lost while the first
    holds its jobs and is still asking the provider, or the batch is paid and never read."""
    from triage.jobs.vocabulary.states import Step

    ledger, client = store.batches, BatchClient(llm(server), server.base_url, "k")
    ids = register(store, payloads, client.classifier.version, ["a", "b"])
    version = client.classifier.version
    claim = store.claim(
        batch_key=BATCH, step=Step.CLASSIFY, limit=10, lease_seconds=600, owner="run-a", classifier_version=version
    )
    key = submission_key(BATCH, ids)
    ledger.open_submission(key, BATCH, version, [(job.id, job.attempt) for job in claim.jobs])  # run a: row written
    # Run b, meanwhile: nothing to submit (run a holds the jobs), nothing to settle, still running.
    assert submit(store, ledger, client, payloads, batch_key=BATCH, owner="run-b") == []
    assert [(s.key, s.status) for s in ledger.open_batches(BATCH)] == [(key, "submitting")]
    result = collect(ledger, client, batch_key=BATCH, actor="run-b")
    assert (result.lost, result.running) == (0, 1)
    provider_id = client.submit([(f"{job.id}:{job.attempt}", "x") for job in claim.jobs], key)  # run a goes on
    ledger.mark_running(key, provider_id)
    assert [(s.key, s.status, s.provider_batch_id) for s in ledger.open_batches(BATCH)] == [
        (key, "running", provider_id)
    ]
    assert server.batches.created == 1
    client.close()
