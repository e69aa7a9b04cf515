"""Outages heal themselves (issue #13, item 3): the model answering 503 or timing out for every
call, or the payload store gone, spends no job's attempt and sends nothing to manual review;
the jobs are parked (``waiting``, ``outage:<dependency>``) until the model's ``Retry-After`` (or
the default), the step stops with :class:`CircuitOpen`, the failed task's callback leaves them
alone, and once the dependency is back the next try completes every job. Real PostgreSQL, the
real classifier against the fake model server on loopback."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from tests.ledger.helpers import classify_try, counts, documents, failure_callback_context, register_documents
from triage.adapters.callbacks import on_task_failure
from triage.classifiers.llm import OpenAICompatibleClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.operators import ClassifyDocumentsOperator
from triage.payloads import PayloadStore
from triage.pipeline.classify import MAX_RETRY_AFTER_SECONDS
from triage.pipeline.steps import CircuitOpen, RunSettings, StepReport

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"
TAXONOMY = Taxonomy.load()


class Switch:
    """The model: down (503, or a reply slower than the client's timeout) until switched back."""

    def __init__(self, down: Reply) -> None:
        self.down: Reply | None = down

    def __call__(self, _body: dict[str, Any]) -> Reply:
        return self.down if self.down is not None else fixed_label("billing", 0.95)(_body)


def register(store: JobStore, payloads: PayloadStore, n: int, version: str, max_attempts: int = 3) -> list[uuid.UUID]:
    docs = documents(n, "charged twice {i}", prefix="O", received_at=datetime(2026, 11, 5, 9, tzinfo=UTC))
    return list(register_documents(store, payloads, docs, version, batch_key=BATCH, max_attempts=max_attempts).new_ids)


def llm(fake: FakeOpenAIServer, timeout_s: float = 5.0) -> OpenAICompatibleClassifier:
    return OpenAICompatibleClassifier(
        base_url=fake.base_url, api_key=None, model="m", taxonomy=TAXONOMY, timeout_s=timeout_s
    )


def classify(
    store: JobStore,
    classifier: OpenAICompatibleClassifier,
    payloads: PayloadStore,
    *,
    try_number: int,
    batch_size: int = 10,
) -> StepReport:
    """One Airflow try of ``classify`` map index 0 (its lease owner names the try); the try
    closes its classifier, as the operator does."""
    settings = RunSettings(
        owner=f"classify_documents/{RUN}/classify/0/try{try_number}",
        batch_size=batch_size,
        retry_soon_seconds=0.0,
        earlier_tries_of="classify_documents/" + RUN + "/classify/0/",
    )
    return classify_try(store, classifier, payloads, settings, batch_key=BATCH)


def reviews(store: JobStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM triage.manual_review")).scalar_one())


def failure_context() -> dict[str, Any]:
    return failure_callback_context(
        run_id=RUN, batch_key=BATCH, task_id="classify", ledger_step=ClassifyDocumentsOperator.ledger_step
    )


@pytest.fixture
def model() -> Iterator[tuple[FakeOpenAIServer, Switch]]:
    switch = Switch(Reply.status_only(503, retry_after="1"))
    with FakeOpenAIServer(responder=switch) as fake:
        yield fake, switch


@pytest.mark.parametrize(
    ("down", "timeout_s", "error_class"),
    [
        pytest.param(Reply.status_only(503, retry_after="1"), 5.0, "server_error", id="503-retry-after"),
        pytest.param(Reply.slow(400), 0.1, "timeout", id="timeouts"),
    ],
)
def test_an_outage_longer_than_every_try_spends_no_attempt_and_heals(
    db_url: DatabaseUrl,
    store: JobStore,
    payloads: PayloadStore,
    model: tuple[FakeOpenAIServer, Switch],
    monkeypatch: pytest.MonkeyPatch,
    down: Reply,
    timeout_s: float,
    error_class: str,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    fake, switch = model
    switch.down = down
    ids = register(store, payloads, 45, llm(fake).version, max_attempts=2)
    for try_number in (1, 2, 3, 4):  # more tries than any job has attempts
        with pytest.raises(CircuitOpen) as stopped:
            classify(store, llm(fake, timeout_s), payloads, try_number=try_number)
        assert stopped.value.dependency == "model"
        assert counts(
            store,
            "SELECT status, attempt, status_reason, last_error_class, count(*) FROM triage.jobs GROUP BY 1, 2, 3, 4",
        ) == {("waiting", 0, "outage:model", error_class): 45}
        with store.engine.connect() as conn:
            wait = conn.execute(sa.text("SELECT max(next_attempt_at - now()) FROM triage.jobs")).scalar_one()
        # Retry-After: 1 s is honoured as the model's word; without one, the default outage wait
        # (30 s) doubled for each earlier parking: the tries thin out while the model stays down.
        if down.retry_after:
            assert wait <= timedelta(seconds=1)
        else:
            assert (
                timedelta(seconds=30 * 2 ** (try_number - 1) - 10)
                < wait
                <= timedelta(seconds=30 * 2 ** (try_number - 1))
            )
        if down.retry_after is None:  # a try only resumes what is due: bring the time forward
            with store.transaction("test") as conn:
                conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))
        else:
            time.sleep(1.1)
    on_task_failure(failure_context())  # Airflow gave up: the callback leaves the parked jobs alone
    assert reviews(store) == 0
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("waiting",): 45}

    switch.down = None  # the model is back: the next run of the date (a new try) finishes the day
    time.sleep(1.1)
    # With the usual timeout: 0.1 s made the slow model an outage, and a healthy answer under load
    # (a make test beside it) took longer too, so the heal run was itself retried (WorkRemains).
    report = classify(store, llm(fake), payloads, try_number=1)
    assert report.claimed == 45
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 1): 45}
    assert reviews(store) == 0
    with store.engine.connect() as conn:
        into_review = conn.execute(
            sa.text("SELECT count(*) FROM triage.job_events WHERE to_status = 'manual_review' AND job_id = ANY(:ids)"),
            {"ids": ids},
        ).scalar_one()
    assert into_review == 0


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_retry_after_is_bounded(
    store: JobStore, payloads: PayloadStore, model: tuple[FakeOpenAIServer, Switch]
) -> None:
    fake, switch = model
    switch.down = Reply.status_only(503, retry_after="999999")
    classifier = OpenAICompatibleClassifier(base_url=fake.base_url, api_key=None, model="m", taxonomy=TAXONOMY)
    register(store, payloads, 25, classifier.version)
    with pytest.raises(CircuitOpen) as stopped:
        classify(store, classifier, payloads, try_number=1, batch_size=25)
    assert stopped.value.retry_after == MAX_RETRY_AFTER_SECONDS
    with store.engine.connect() as conn:
        lo, hi = conn.execute(
            sa.text("SELECT min(next_attempt_at - now()), max(next_attempt_at - now()) FROM triage.jobs")
        ).one()
    assert timedelta(seconds=MAX_RETRY_AFTER_SECONDS - 60) < lo <= hi <= timedelta(seconds=MAX_RETRY_AFTER_SECONDS)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_per_job_429_waits_its_retry_after(
    store: JobStore, payloads: PayloadStore, model: tuple[FakeOpenAIServer, Switch]
) -> None:
    fake, switch = model
    switch.down = None
    fake.enqueue(Reply.status_only(429, retry_after="120"))
    classifier = OpenAICompatibleClassifier(base_url=fake.base_url, api_key=None, model="m", taxonomy=TAXONOMY)
    register(store, payloads, 1, classifier.version)
    with pytest.raises(Exception, match="due in"):
        classify(store, classifier, payloads, try_number=1)
    with store.engine.connect() as conn:
        status, attempt, wait = conn.execute(
            sa.text("SELECT status, attempt, next_attempt_at - now() FROM triage.jobs")
        ).one()
    assert (status, attempt) == ("retryable_failed", 1)  # one job failing is not an outage
    assert timedelta(seconds=110) < wait <= timedelta(seconds=120)


def test_the_payload_store_gone_parks_the_batch(
    db_url: DatabaseUrl,
    store: JobStore,
    tmp_path: Path,
    model: tuple[FakeOpenAIServer, Switch],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    fake, switch = model
    switch.down = None
    payloads = PayloadStore(tmp_path / "payloads")
    classifier = OpenAICompatibleClassifier(base_url=fake.base_url, api_key=None, model="m", taxonomy=TAXONOMY)
    register(store, payloads, 30, classifier.version)
    (tmp_path / "payloads").rename(tmp_path / "unmounted")
    with pytest.raises(CircuitOpen) as stopped:
        classify(store, classifier, payloads, try_number=1)
    assert stopped.value.dependency == "payload_store"
    assert counts(store, "SELECT status, attempt, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2, 3") == {
        ("waiting", 0, "outage:payload_store"): 30
    }
    on_task_failure(failure_context())
    assert reviews(store) == 0
    (tmp_path / "unmounted").rename(tmp_path / "payloads")
    with store.transaction("test") as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))
    classify(store, llm(fake), payloads, try_number=2)
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("completed",): 30}


@pytest.mark.parametrize("batch_size", [pytest.param(10, id="one-claim"), pytest.param(1, id="a-claim-per-job")])
def test_a_small_batch_in_a_total_outage_is_parked_not_spent(
    db_url: DatabaseUrl,
    store: JobStore,
    payloads: PayloadStore,
    model: tuple[FakeOpenAIServer, Switch],
    monkeypatch: pytest.MonkeyPatch,
    batch_size: int,
) -> None:
    """Five jobs never make the 20 calls the window rule judges: before the all-down rule every
    job spent its attempts and went to review (retries_exhausted)."""
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    fake, switch = model
    switch.down = Reply.status_only(503)
    register(store, payloads, 5, llm(fake).version)
    with pytest.raises(CircuitOpen) as stopped:
        classify(store, llm(fake), payloads, try_number=1, batch_size=batch_size)
    assert stopped.value.dependency == "model"
    assert fake.request_count <= 3, "parked once the calls of a few distinct jobs all failed"
    assert counts(
        store,
        "SELECT status, attempt, status_reason, last_error_class, count(*) FROM triage.jobs GROUP BY 1, 2, 3, 4",
    ) == {("waiting", 0, "outage:model", "server_error"): 5}, "every attempt given back, the failed calls' too"
    on_task_failure(failure_context())
    assert reviews(store) == 0

    switch.down = None
    with store.transaction("test") as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))
    classify(store, llm(fake), payloads, try_number=2, batch_size=batch_size)
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 1): 5}
    assert reviews(store) == 0


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_one_document_whose_calls_fail_is_not_an_outage(
    store: JobStore, payloads: PayloadStore, model: tuple[FakeOpenAIServer, Switch]
) -> None:
    """The others answer, so the job spends its attempts and a person gets it; alone in a later
    try (having failed before) it still is not taken for an outage."""
    fake, _ = model
    answer = fixed_label("billing", 0.95)

    def one_bad(body: dict[str, Any]) -> Reply:
        text = " ".join(str(m.get("content", "")) for m in body.get("messages", []))
        return Reply.status_only(503) if "charged twice 0" in text else answer(body)

    fake.responder = one_bad
    register(store, payloads, 5, llm(fake).version, max_attempts=2)
    with pytest.raises(Exception, match="due in"):
        classify(store, llm(fake), payloads, try_number=1)
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {
        ("completed", 1): 4,
        ("retryable_failed", 1): 1,
    }
    with store.transaction("test") as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'"))
    classify(store, llm(fake), payloads, try_number=2)
    assert counts(store, "SELECT status, status_reason, count(*) FROM triage.jobs GROUP BY 1, 2") == {
        ("completed", "completed"): 4,
        ("manual_review", "retries_exhausted"): 1,
    }
    assert reviews(store) == 1
