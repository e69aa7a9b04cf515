"""Alerts on a real PostgreSQL and a real loopback webhook: a ``classify_documents`` run's alert
task, the orphans alert of ``reconcile_jobs``, and the deadline alert's callback as Airflow's
executor calls it. No Airflow run: operators behind their seams (the test's engine, a recording
metrics sink), connections from ``AIRFLOW_CONN_*``."""

from __future__ import annotations

import json
import logging
import socket
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, cast

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from tests.ledger.helpers import new_jobs
from tests.ledger.test_callbacks import failure_context
from triage.adapters.callbacks import on_task_failure
from triage.alerts import Thresholds
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, Fail, SendToReview
from triage.jobs.vocabulary.states import JobStatus
from triage.observability import RecordingMetrics
from triage.operators.alerts import RunAlertsOperator, alert_on_orphans
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

if TYPE_CHECKING:
    from airflow.sdk import Context

BATCH = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
RUN = "manual__2026-11-06T00:00:00+00:00"
OTHER_RUN = "scheduled__2026-11-06T00:00:00+00:00"
KEY = f"triage-alert/review_threshold/classify_documents/{RUN}"


def owner(task_id: str, run: str = RUN, map_index: int = 0) -> str:
    return f"classify_documents/{run}/{task_id}/{map_index}/try1"


def a_run(
    store: JobStore, *, review: int = 0, terminal: int = 0, completed: int = 0, run: str = RUN, prefix: str = "doc"
) -> list[uuid.UUID]:
    """A run of the batch as classify leaves it: jobs registered and claimed under the run's
    actors, then sent to review (inconclusive), failed (unsupported schema) or completed."""
    total = review + terminal + completed
    store.register(
        new_jobs(total, prefix=prefix), batch_key=BATCH, step="classify", max_attempts=3, actor=owner("retrieve", run)
    )
    claim = store.claim(batch_key=BATCH, step="classify", limit=total, lease_seconds=300, owner=owner("classify", run))
    jobs = list(claim.jobs)
    outcomes: list[Any] = [SendToReview(j.id, j.attempt, "inconclusive") for j in jobs[:review]]
    outcomes += [Fail(j.id, j.attempt, "unsupported_schema_version") for j in jobs[review : review + terminal]]
    outcomes += [Complete(j.id, j.attempt) for j in jobs[review + terminal :]]
    store.record(claim, outcomes)
    return [j.id for j in jobs]


def run_context(run: str = RUN, dag_id: str = "classify_documents") -> Context:
    """What Airflow hands the alert task of a run: the fields it reads, the task instance a stand-in."""
    ti = SimpleNamespace(dag_id=dag_id, run_id=run, task_id="alert", map_index=-1, try_number=1)
    # The fields the alert code reads; a stand-in task instance, not Airflow's RuntimeTaskInstance.
    return cast(
        "Context",
        {
            "ti": ti,
            "params": {},
            "data_interval_start": datetime(2026, 11, 5, tzinfo=UTC),
            "data_interval_end": datetime(2026, 11, 6, tzinfo=UTC),
            # triggered a minute ago: the read of the run's moves is bounded by it, as in a deployment
            "dag_run": SimpleNamespace(run_after=datetime.now(UTC) - timedelta(minutes=1)),
        },
    )


def alert_task(store: JobStore, metrics: RecordingMetrics | None = None, run: str = RUN) -> dict[str, Any]:
    """Run the alert task with the test's database and a metrics sink the test reads."""
    sink = metrics or RecordingMetrics()

    class Seamed(RunAlertsOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

        def get_metrics(self) -> RecordingMetrics:
            return sink

    return Seamed(task_id="alert").execute(run_context(run))


def webhook(monkeypatch: pytest.MonkeyPatch, url: str, **extra: Any) -> None:
    """The ``triage_alerts`` connection, as an operator writes it in the UI (conn type http)."""
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_ALERTS", json.dumps({"conn_type": "http", "host": url, "extra": extra}))


@pytest.fixture
def provider() -> Any:
    with FakeProvider() as fake:
        yield fake


@pytest.fixture(autouse=True)
def no_alert_connection(monkeypatch: pytest.MonkeyPatch, db_url: DatabaseUrl) -> None:
    monkeypatch.delenv("AIRFLOW_CONN_TRIAGE_ALERTS", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_TRIAGE_DB", db_url.airflow_connection_json())


def closed_port_url() -> str:
    """A loopback URL nothing listens on: the webhook is down."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/alerts"


# -- classify_documents: the run's alert task -------------------------------------------------


def test_a_run_over_the_review_threshold_posts_exactly_one_alert_with_its_counts(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url, headers={"Authorization": "Bearer alert-token"})
    a_run(store, review=12, completed=28)  # 30% of 40, over 10 jobs and 10%
    metrics = RecordingMetrics()

    result = alert_task(store, metrics)

    assert dict(provider.requests) == {KEY: 1}
    body = provider.effects[KEY]
    alert = body["triage_alert"]
    assert (alert["kind"], alert["count"], alert["run_id"]) == ("review_threshold", 12, RUN)
    assert alert["details"]["batch_jobs"] == 40
    assert alert["details"]["reasons"] == {"inconclusive": 12}
    assert alert["details"]["batch_key"] == BATCH
    assert len(alert["job_ids"]) == 12
    assert alert["links"]["run"].endswith("/dags/classify_documents/runs/manual__2026-11-06T00%3A00%3A00%2B00%3A00")
    assert body["text"].startswith("[Triage] 12 of 40 jobs (30%) entered manual review in classify_documents run")
    assert "doc-" not in json.dumps(body)  # ids, counts and reasons only: no external id, no document
    assert result["alerts"] == {"review_threshold": "sent"}
    assert result["review_entered"] == 12
    assert metrics.counters() == {
        "triage.review.entered": 12,
        "triage.terminal.entered": 0,
        "triage.alerts.sent.review_threshold": 1,
    }


def test_a_run_under_the_thresholds_alerts_nobody(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url)
    a_run(store, review=4, completed=36)  # 10% of 40 but fewer than 10 jobs: a model's usual doubt

    result = alert_task(store)

    assert provider.requests == {}
    assert result["alerts"] == {}
    assert result["review_entered"] == 4


def test_a_terminal_failure_alerts_and_the_thresholds_come_from_the_connection(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url, review_min_jobs=2, review_fraction=0.05, format="text")
    a_run(store, review=3, terminal=1, completed=36)

    alert_task(store)

    review, terminal = KEY, f"triage-alert/terminal_failures/classify_documents/{RUN}"
    assert dict(provider.requests) == {review: 1, terminal: 1}
    assert set(provider.effects[review]) == {"text"}  # format "text": Slack's form alone
    assert "1 of 40 jobs (2%) failed terminally" in provider.effects[terminal]["text"]
    assert "unsupported_schema_version 1" in provider.effects[terminal]["text"]


def test_only_this_runs_moves_count_and_the_failure_callbacks_do(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two runs share the date's batch: the other run's review entries are not this run's. What
    the failure callback moved when Airflow gave up (before this task starts) is."""
    webhook(monkeypatch, provider.url)
    a_run(store, review=30, run=OTHER_RUN, prefix="other")
    a_run(store, review=2, completed=20)
    store.register(
        new_jobs(9, prefix="late"), batch_key=BATCH, step="classify", max_attempts=3, actor=owner("retrieve")
    )
    held = store.claim(
        batch_key=BATCH, step="classify", limit=9, lease_seconds=300, owner=owner("classify", map_index=1)
    )
    assert len(held.jobs) == 9

    on_task_failure(failure_context(1, try_number=1))
    result = alert_task(store)

    assert result["review_entered"] == 11
    assert dict(provider.requests) == {KEY: 1}
    assert provider.effects[KEY]["triage_alert"]["details"]["reasons"] == {"airflow_task_failed": 9, "inconclusive": 2}


def test_without_the_connection_the_alert_is_a_log_line(store: JobStore, caplog: pytest.LogCaptureFixture) -> None:
    a_run(store, review=15, completed=5)
    caplog.set_level(logging.WARNING, logger="triage")

    result = alert_task(store)

    assert result["alerts"] == {"review_threshold": "logged"}
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("ALERT ")]
    assert len(lines) == 1
    assert f"kind=review_threshold dag=classify_documents run={RUN} count=15" in lines[0]


@pytest.mark.parametrize("down", [pytest.param("refused", id="connection-refused"), pytest.param("503", id="http-503")])
def test_a_webhook_that_is_down_never_fails_the_task(
    store: JobStore,
    provider: FakeProvider,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    down: str,
) -> None:
    if down == "503":
        provider.fail_next = 1
        webhook(monkeypatch, provider.url)
    else:
        webhook(monkeypatch, closed_port_url())
    a_run(store, review=20, completed=0)
    caplog.set_level(logging.WARNING, logger="triage")
    metrics = RecordingMetrics()

    result = alert_task(store, metrics)  # returns: the task succeeds

    assert result["alerts"]["review_threshold"] == ("failed: HTTP 503" if down == "503" else "failed: ConnectError")
    assert metrics.counters()["triage.alerts.failed.review_threshold"] == 1
    (line,) = [r.getMessage() for r in caplog.records if "not delivered" in r.getMessage()]
    assert "kind=review_threshold" in line
    assert "count=20" in line
    assert "127.0.0.1" not in line  # the webhook's URL (a secret, for Slack) is never logged
    assert provider.effects == {}


# -- reconcile_jobs: orphans ------------------------------------------------------------------


def test_reconciliation_that_takes_back_orphans_alerts_once(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url)
    store.register(new_jobs(3, prefix="orphan"), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=3, lease_seconds=60, owner="a-dead-worker")
    with store.engine.begin() as conn:
        conn.execute(sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s'"))
    context = run_context("scheduled__2026-11-30T10:00:00+00:00", dag_id="reconcile_jobs")
    metrics = RecordingMetrics()

    first = reconcile(store, ReconcileParams())
    outcome = alert_on_orphans(first.summary, context, metrics=metrics)
    again = alert_on_orphans(reconcile(store, ReconcileParams()).summary, context, metrics=metrics)

    assert (outcome, again) == ("sent", None)
    key = "triage-alert/orphans/reconcile_jobs/scheduled__2026-11-30T10:00:00+00:00"
    assert dict(provider.requests) == {key: 1}
    alert = provider.effects[key]["triage_alert"]
    assert alert["count"] == 3
    assert alert["details"]["repairs"] == {"lease_released": 3}
    assert sorted(alert["job_ids"]) == sorted(str(j.id) for j in claim.jobs)
    assert alert["details"]["reconciliation_run"] == first.run_id
    assert metrics.counters() == {"triage.reconcile.orphans": 3, "triage.alerts.sent.orphans": 1}
    assert {store.get_status(j.id) for j in claim.jobs} == {JobStatus.RETRYABLE_FAILED}


def test_a_reconciliation_without_orphans_alerts_nobody(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url)
    a_run(store, review=20)  # review entries are the classify run's alert, not an orphan
    summary = reconcile(store, ReconcileParams()).summary
    assert alert_on_orphans(summary, run_context(dag_id="reconcile_jobs"), metrics=RecordingMetrics()) is None
    assert provider.requests == {}


# -- the deadline: Airflow's executor calls the notifier --------------------------------------


def call_deadline_callback(context: dict[str, Any], tmp_path: Path) -> tuple[bool, str | None]:
    """``SyncCallback(DeadlineMissedNotifier, kwargs)`` as Airflow 3.3's executor runs it
    (``callback_supervisor.execute_callback``): the class is built with the kwargs and the
    reduced context ``Deadline.handle_miss`` gives, then called with the context."""
    import structlog
    from airflow.sdk.execution_time.callback_supervisor import execute_callback

    from triage.operators.alerts import classify_deadline

    callback = classify_deadline().callback
    return execute_callback(
        callback.path,
        {**callback.kwargs, "context": context},
        Path("dag.py"),
        tmp_path,
        structlog.get_logger("callback"),
    )


def deadline_context(deadline_time: str, queued_at: str) -> dict[str, Any]:
    run = {
        "dag_id": "classify_documents",
        "dag_run_id": RUN,
        "state": "running",
        "queued_at": queued_at,
        "logical_date": "2026-11-05T00:00:00Z",
        "run_type": "scheduled",
    }
    return {"dag_run": run, "deadline": {"id": str(uuid.uuid4()), "deadline_time": deadline_time}}


def test_the_deadline_callback_alerts_as_the_executor_calls_it(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    webhook(monkeypatch, provider.url)

    ok, error = call_deadline_callback(deadline_context("2026-11-06T02:00:00Z", "2026-11-06T00:00:05Z"), tmp_path)

    assert (ok, error) == (True, None)
    key = f"triage-alert/deadline_missed/classify_documents/{RUN}"
    assert dict(provider.requests) == {key: 1}
    alert = provider.effects[key]["triage_alert"]
    assert alert["details"] == {
        "state": "running",
        "deadline_time": "2026-11-06T02:00:00+00:00",
        "queued_at": "2026-11-06T00:00:05+00:00",
    }
    assert "had not succeeded by its deadline 2026-11-06T02:00:00+00:00" in provider.effects[key]["text"]


def test_a_deadline_past_before_the_run_was_queued_is_no_miss(
    provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A backfill (or a manual run) of a past date: its logical date's deadline was gone when it
    was queued; the scheduler still calls the callback at once, and nothing is sent."""
    webhook(monkeypatch, provider.url)
    caplog.set_level(logging.INFO, logger="triage")

    ok, _ = call_deadline_callback(deadline_context("2026-11-06T02:00:00Z", "2026-11-20T09:00:00Z"), tmp_path)

    assert ok
    assert provider.requests == {}
    assert any("had passed before the run began" in r.getMessage() for r in caplog.records)


def test_invalid_thresholds_fall_back_to_the_defaults(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch
) -> None:
    webhook(monkeypatch, provider.url, review_fraction=7, review_min_jobs="many")
    a_run(store, review=10, completed=10)
    alert_task(store)
    assert dict(provider.requests) == {KEY: 1}  # the defaults: >= 10 jobs and >= 10%
    assert Thresholds().review.min_jobs == 10
