"""The label provider down at persist is an outage, not the jobs' failure (issue #13, item 3): a
provider that refuses connections or answers 5xx to every action spends no job's attempt and
sends nothing to manual review; the jobs are parked (``waiting``, ``outage:label_provider``),
the step stops with :class:`CircuitOpen`, the failed task's callback leaves them alone, and once
the provider is back the next try completes every job with one effect per key. One document
whose action fails is not an outage. Real PostgreSQL, the real webhook action against a
provider on loopback."""

from __future__ import annotations

import socket
import uuid
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from tests.ledger.helpers import counts, failure_callback_context
from triage.adapters.callbacks import on_task_failure
from triage.adapters.http_actions import WebhookLabelAction
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Advance, ClassificationRecord, NewJob
from triage.operators import PersistLabelsOperator
from triage.pipeline.persist import PersistHandler
from triage.pipeline.steps import CircuitOpen, RunSettings, StepReport, run_step

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"
VERSION = "keyword-v1"


def at_persist(store: JobStore, n: int, max_attempts: int = 2) -> list[uuid.UUID]:
    """``n`` jobs classified (accepted) and waiting at the persist step."""
    new = [
        NewJob(f"tickets:P-{i:03d}:{i:064x}:{VERSION}", "tickets", f"P-{i:03d}", f"{i:064x}", f"file:///p/{i}", VERSION)
        for i in range(n)
    ]
    ids = list(store.register(new, batch_key=BATCH, step="classify", max_attempts=max_attempts).new_ids)
    claim = store.claim(batch_key=BATCH, step="classify", limit=n, lease_seconds=60, owner="classify")
    store.record(
        claim,
        [
            Advance(j.id, j.attempt, "persist", ClassificationRecord("billing", 0.9, "accepted", VERSION))
            for j in claim.jobs
        ],
    )
    return ids


def persist(store: JobStore, url: str, *, try_number: int, retry_soon_seconds: float = 0.0) -> StepReport:
    """One Airflow try of ``persist`` (its lease owner names the try)."""
    action = WebhookLabelAction(url, timeout_s=2)
    try:
        return run_step(
            store,
            PersistHandler(store, action),
            batch_key=BATCH,
            settings=RunSettings(
                owner=f"classify_documents/{RUN}/persist/-1/try{try_number}",
                batch_size=4,
                retry_soon_seconds=retry_soon_seconds,
                earlier_tries_of=f"classify_documents/{RUN}/persist/-1/",
            ),
        )
    finally:
        action.close()


def into_review(store: JobStore) -> int:
    with store.engine.connect() as conn:
        return int(
            conn.execute(
                sa.text("SELECT count(*) FROM triage.job_events WHERE to_status = 'manual_review'")
            ).scalar_one()
        )


def failure_context() -> dict[str, Any]:
    return failure_callback_context(
        run_id=RUN, batch_key=BATCH, task_id="persist", ledger_step=PersistLabelsOperator.ledger_step
    )


def refused_port() -> int:
    """A loopback port nothing listens on (connections are refused until the provider binds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_due(store: JobStore) -> None:
    with store.transaction("test") as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))


@pytest.mark.parametrize("down", ["refused", "503"])
def test_a_provider_down_longer_than_every_try_spends_no_attempt_and_heals(
    db_url: DatabaseUrl, store: JobStore, monkeypatch: pytest.MonkeyPatch, down: str
) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())
    at_persist(store, 12, max_attempts=2)
    port = refused_port()
    failing = FakeProvider() if down == "503" else None
    if failing is not None:
        failing.fail_next = 10**6
        failing.__enter__()
    url = failing.url if failing is not None else f"http://127.0.0.1:{port}/labels"
    try:
        for try_number in (1, 2, 3):  # more tries than any job has attempts
            with pytest.raises(CircuitOpen) as stopped:
                persist(store, url, try_number=try_number)
            assert stopped.value.dependency == "label_provider"
            assert counts(
                store,
                "SELECT status, step, attempt, status_reason, last_error_class, count(*) FROM triage.jobs GROUP BY 1, 2, 3, 4, 5",
            ) == {
                (
                    "waiting",
                    "persist",
                    1,  # classify's: persist's attempts were given back
                    "outage:label_provider",
                    "connection_error" if down == "refused" else "server_error",
                ): 12
            }
            with store.engine.connect() as conn:
                wait = conn.execute(sa.text("SELECT max(next_attempt_at - now()) FROM triage.jobs")).scalar_one()
            # 30 s doubled for each earlier parking: the tries thin out while the provider is down
            assert (
                timedelta(seconds=30 * 2 ** (try_number - 1) - 10)
                < wait
                <= timedelta(seconds=30 * 2 ** (try_number - 1))
            )
            make_due(store)  # a try only resumes what is due: bring the time forward
        if failing is not None:
            assert len(failing.effects) == 0  # nothing was applied while it was down
    finally:
        if failing is not None:
            failing.__exit__(None, None, None)
    on_task_failure(failure_context())  # Airflow gave up: the callback leaves the parked jobs alone
    assert into_review(store) == 0
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("waiting",): 12}

    with FakeProvider(port=port if down == "refused" else 0) as provider:  # the provider is back
        report = persist(store, provider.url, try_number=1)  # the next run of the date
        assert report.claimed == 12
        assert len(provider.effects) == 12
        assert set(provider.requests.values()) == {1}
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 2): 12}
    assert into_review(store) == 0


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_one_document_whose_action_is_refused_is_not_an_outage(store: JobStore) -> None:
    """A provider that answers (here: 503 to the first request only, then fine) is not down; a
    single failed action is the job's, retried within its attempts."""
    at_persist(store, 12, max_attempts=3)
    with FakeProvider() as provider:
        provider.fail_next = 1
        report = persist(store, provider.url, try_number=1, retry_soon_seconds=60.0)  # waits for its retry
    assert report.claimed >= 12
    assert counts(store, "SELECT status, count(*) FROM triage.jobs GROUP BY 1") == {("completed",): 12}
    assert counts(store, "SELECT attempt, count(*) FROM triage.jobs GROUP BY 1") == {(2,): 11, (3,): 1}
