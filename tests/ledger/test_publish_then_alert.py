"""``publish_events`` alerts for its run and skips the ``alert`` teardown (issue #29: no task
process only to alert), through a real ``execute`` on a real PostgreSQL with a loopback webhook;
when its alert cannot read the ledger it logs why and leaves the teardown to alert, never
failing the relay."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa
from airflow.sdk import DAG
from airflow.sdk.exceptions import DownstreamTasksSkipped

from tests.fakes.provider import FakeProvider
from tests.ledger.test_alerts import KEY, RUN, a_run, run_context, webhook
from triage.jobs.store import JobStore
from triage.observability import RecordingMetrics
from triage.operators.alerts import PublishEventsThenAlertOperator, RunAlertsOperator


def publish_task(store: JobStore, events: Path, metrics: RecordingMetrics, *, broken_ledger: bool = False) -> Any:
    """``publish_events`` as the DAG wires it (the ``alert`` teardown its direct downstream), with
    the test's database; ``broken_ledger``: the alert's read of the ledger raises."""

    class Seamed(PublishEventsThenAlertOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

    class SeamedAlert(RunAlertsOperator):  # publish_events alerts with its teardown's read and metrics
        def get_metrics(self) -> RecordingMetrics:
            return metrics

        def run_moves(self, store: JobStore, context: Any) -> Any:
            if broken_ledger:
                raise sa.exc.OperationalError("SELECT", {}, Exception("the job database is down"))
            return super().run_moves(store, context)

    with DAG("classify_documents", schedule=None):
        task = Seamed(task_id="publish_events", event_log=str(events))
        task >> SeamedAlert(task_id="alert").as_teardown()
    return task


def outbox_events(store: JobStore) -> int:
    with store.engine.connect() as conn:
        return int(conn.execute(sa.text("SELECT count(*) FROM triage.outbox")).scalar_one())


def context_with_xcoms() -> tuple[Any, dict[str, Any]]:
    """The run's context with a task instance that keeps what is pushed to XCom."""
    pushed: dict[str, Any] = {}
    context: Any = dict(run_context())
    ti = context["ti"]
    context["ti"] = SimpleNamespace(**vars(ti), xcom_push=lambda key, value: pushed.__setitem__(key, value))
    return context, pushed


@pytest.fixture
def provider() -> Any:
    with FakeProvider() as fake:
        yield fake


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_publish_events_alerts_once_then_skips_the_teardown(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    webhook(monkeypatch, provider.url)
    a_run(store, review=12, completed=28)  # over the review threshold
    metrics = RecordingMetrics()
    context, pushed = context_with_xcoms()

    with pytest.raises(DownstreamTasksSkipped) as skipped:
        publish_task(store, tmp_path / "events.jsonl", metrics).execute(context)

    assert skipped.value.tasks == ["alert"]  # the runner sends it to the API server as it succeeds
    assert dict(provider.requests) == {KEY: 1}
    done = pushed["return_value"]  # pushed before the skip ended execute
    assert done["published"] == outbox_events(store) > 0
    assert done["run_alerts"]["review_entered"] == 12
    assert done["run_alerts"]["alerts"] == {"review_threshold": "sent"}
    assert "skipmixin_key" not in pushed  # no skip record for a cleared run to obey (the e2e test says why)
    assert metrics.counters()["triage.alerts.sent.review_threshold"] == 1
    assert RUN in context["ti"].run_id


@pytest.mark.own_database
def test_an_alert_that_cannot_read_the_ledger_leaves_the_teardown_to_alert(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: Any
) -> None:
    webhook(monkeypatch, provider.url)
    a_run(store, review=12, completed=28)
    context, pushed = context_with_xcoms()
    task = publish_task(store, tmp_path / "events.jsonl", RecordingMetrics(), broken_ledger=True)

    with caplog.at_level(logging.ERROR, logger="triage.operators.alerts"):
        done = task.execute(context)  # no DownstreamTasksSkipped: the teardown is left to run

    assert done == {"published": outbox_events(store)}  # the relay's work stands
    assert "run_alerts" not in done
    assert pushed == {}
    assert dict(provider.requests) == {}
    assert "the alert teardown will" in caplog.text


@pytest.mark.own_database
def test_publish_events_reads_the_run_s_moves_before_it_disposes_its_engine(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The alert's read reuses the try's pooled connection: nothing is checked out of the engine
    once the relay disposed it (a disposed pool opens a new connection)."""
    webhook(monkeypatch, provider.url)
    a_run(store, review=12, completed=28)
    context, _pushed = context_with_xcoms()
    task = publish_task(store, tmp_path / "events.jsonl", RecordingMetrics())
    disposed: list[bool] = []
    checked_out_after_dispose: list[bool] = []
    monkeypatch.setattr(task, "dispose", lambda: disposed.append(True))  # the test's engine outlives the task
    sa.event.listen(store.engine, "checkout", lambda *_: checked_out_after_dispose.append(bool(disposed)))

    with pytest.raises(DownstreamTasksSkipped):
        task.execute(context)

    assert disposed
    assert checked_out_after_dispose, "the try used the engine"
    assert True not in checked_out_after_dispose
    assert dict(provider.requests) == {KEY: 1}  # and it alerted


@pytest.mark.own_database
def test_without_an_alert_teardown_downstream_publish_events_only_relays(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The teardown is found in the graph (the one ``RunAlertsOperator`` directly downstream):
    another task downstream is no teardown to do the work of, nor to skip."""
    from airflow.sdk.bases.operator import BaseOperator

    webhook(monkeypatch, provider.url)
    a_run(store, review=12, completed=28)
    context, pushed = context_with_xcoms()

    class Seamed(PublishEventsThenAlertOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

    with DAG("classify_documents", schedule=None):
        task = Seamed(task_id="publish_events", event_log=str(tmp_path / "events.jsonl"))
        task >> BaseOperator(task_id="alert")
    assert task.alert_teardown() is None

    assert task.execute(context) == {"published": outbox_events(store)}  # no skip raised
    assert pushed == {}
    assert dict(provider.requests) == {}


def test_only_a_teardown_is_done_and_skipped_for(tmp_path: Path) -> None:
    """A ``RunAlertsOperator`` downstream that is no teardown is not skipped for: it would not run
    (and alert) when ``publish_events`` failed, as a teardown does."""
    with DAG("classify_documents", schedule=None):
        task = PublishEventsThenAlertOperator(task_id="publish_events", event_log=str(tmp_path / "events.jsonl"))
        task >> RunAlertsOperator(task_id="alert")
    assert task.alert_teardown() is None


@pytest.mark.own_database
def test_a_sink_that_cannot_be_built_still_leaves_the_engine_disposed(
    store: JobStore, provider: FakeProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The alert's read opens the try's engine before the relay builds its sink: a sink that
    cannot be built (a bad webhook connection) fails the task and still disposes the engine."""
    webhook(monkeypatch, provider.url)
    a_run(store, review=12, completed=28)
    context, _pushed = context_with_xcoms()
    task = publish_task(store, tmp_path / "events.jsonl", RecordingMetrics())
    disposed: list[bool] = []
    monkeypatch.setattr(task, "dispose", lambda: disposed.append(True))  # the test's engine outlives the task

    def no_sink(context: Any = None) -> Any:
        raise ValueError("the webhook connection names no host")

    monkeypatch.setattr(task, "build_sink", no_sink)

    with pytest.raises(ValueError, match="names no host"):
        task.execute(context)

    assert disposed == [True]
    assert dict(provider.requests) == {}  # nothing alerted: the teardown will
