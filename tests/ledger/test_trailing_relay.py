"""The relay beside ``classify`` (issue #29, :mod:`triage.pipeline.trailing_relay`) on a real
PostgreSQL: the events it relays while the chunks commit reach the sink exactly as
``publish_events`` alone would write them (byte-compared), a sink down during the step neither
fails nor stops the step and leaves every event to ``publish_events``, and the operator relays
through the sink of the ``publish_events`` task downstream of it, or not at all.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import documents, register_documents
from triage.classifiers.base import ClassifyRequest, ModelOutput
from triage.classifiers.keyword import KeywordClassifier
from triage.classifiers.taxonomy import Taxonomy
from triage.contracts.events import WorkEvent, parse_event
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import batch_key_for
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.one_transaction import run_step_in_chunks
from triage.pipeline.publish import JsonlEventSink, publish_all
from triage.pipeline.steps import RunSettings, run_step
from triage.pipeline.trailing_relay import RELAY_IN_CLASSIFY_VARIABLE, TrailingRelay

BATCH = "trailing"
SECRET = "Dear support, my card 4111 was charged twice"
"""A document's text: never in a log line."""


class Unhurried:
    """The keyword classifier, a millisecond a document slower: the step lasts long enough for
    the relay beside it to find completions committed before the step's end."""

    def __init__(self) -> None:
        self.inner = KeywordClassifier(Taxonomy.load())
        self.version = self.inner.version

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        time.sleep(0.001)
        return self.inner.classify(request)

    def close(self) -> None:
        self.inner.close()


class Down:
    """A sink that is down: every call raises (with text that must not reach a log)."""

    batch_size = 5000

    def __init__(self) -> None:
        self.calls = 0

    def publish(self, events: Sequence[WorkEvent]) -> None:
        self.calls += 1
        raise ConnectionError(f"sink down while sending {SECRET}")

    def close(self) -> None:
        pass


def scalar(store: JobStore, sql: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql)).scalar()


def unsent(store: JobStore) -> int:
    return int(
        scalar(
            store,
            "SELECT count(*) FROM triage.outbox"
            " WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
    )


def classify_with_relay(store: JobStore, payloads: PayloadStore, relay: TrailingRelay, n: int) -> Any:
    classifier = Unhurried()
    register_documents(store, payloads, documents(n, SECRET + " {i}"), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0))
    try:
        with relay:
            return run_step_in_chunks(
                store,
                handler,
                batch_key=BATCH,
                settings=RunSettings(owner="w/try1", batch_size=50),
                committed=relay.committed,
            )
    finally:
        handler.close()


@pytest.mark.own_database  # the chunks commit from lanes of their own; the relay reads only committed events
def test_events_relayed_during_classify_reach_the_sink_as_publish_events_alone_writes_them(
    store: JobStore, payloads: PayloadStore, tmp_path: Path
) -> None:
    beside = tmp_path / "beside.jsonl"
    relay = TrailingRelay(store, JsonlEventSink(beside), actor="w/try1 relay", limit=200)
    report = classify_with_relay(store, payloads, relay, 600)
    assert report.claimed == 600
    # While the step ran: its registrations and completions committed during it, not only the former.
    assert relay.failed is None
    assert relay.sent > 600
    left = publish_all(store, JsonlEventSink(beside))  # publish_events: the rest
    assert relay.sent + left == 1200
    assert unsent(store) == 0
    ids = [str(parse_event(line).event_id) for line in beside.read_bytes().splitlines()]
    assert len(ids) == len(set(ids)) == 1200

    # The same events relayed by publish_events alone (the watermark back to its start): the same bytes.
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.outbox_watermark SET txid = 0, event_id = '00000000-0000-0000-0000-000000000000'")
        )
    alone = tmp_path / "alone.jsonl"
    assert publish_all(store, JsonlEventSink(alone)) == 1200
    assert beside.read_bytes() == alone.read_bytes()


@pytest.mark.own_database  # the chunks commit from lanes of their own; the relay reads only committed events
def test_a_sink_down_during_classify_leaves_the_jobs_completed_and_publish_events_sends_every_event(
    store: JobStore, payloads: PayloadStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    down = Down()
    relay = TrailingRelay(store, down, actor="w/try1 relay")
    with caplog.at_level(logging.INFO):
        report = classify_with_relay(store, payloads, relay, 300)
    assert report.claimed == 300
    assert report.outcomes == {"Complete": 300}
    assert scalar(store, "SELECT count(*) FROM triage.jobs WHERE status = 'completed'") == 300
    # One refused batch ended the relay beside the step: nothing marked, the claim given back.
    assert (down.calls, relay.sent, relay.failed) == (1, 0, "ConnectionError")
    assert unsent(store) == 600
    assert scalar(store, "SELECT count(*) FROM triage.outbox_claims") == 0
    assert "ConnectionError" in caplog.text
    assert SECRET not in caplog.text
    assert "4111" not in caplog.text
    path = tmp_path / "events.jsonl"
    assert publish_all(store, JsonlEventSink(path)) == 600  # publish_events, the sink back
    ids = [str(parse_event(line).event_id) for line in path.read_bytes().splitlines()]
    assert len(ids) == len(set(ids)) == 600


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_leased_path_is_relayed_beside_too(store: JobStore, payloads: PayloadStore, tmp_path: Path) -> None:
    """A retry try (leased) does not wake the relay: it looks every IDLE_SECONDS, and stops with the step."""
    classifier = Unhurried()
    register_documents(store, payloads, documents(200), classifier.version, batch_key=BATCH)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.0))
    path = tmp_path / "events.jsonl"
    try:
        with TrailingRelay(store, JsonlEventSink(path), actor="w/try2 relay") as relay:
            report = run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="w/try2", batch_size=50))
    finally:
        handler.close()
    assert report.claimed == 200
    assert relay.sent >= 200  # the registrations at least, at once
    assert relay.sent + publish_all(store, JsonlEventSink(path)) == 400
    assert unsent(store) == 0


class Measuring:
    """A sink that reads how long the claim of what it is sent still holds, while it sends."""

    def __init__(self, store: JobStore) -> None:
        self.store, self.holds = store, list[Any]()

    def publish(self, events: Sequence[WorkEvent]) -> None:
        self.holds.append(
            scalar(self.store, "SELECT extract(epoch FROM max(claimed_until) - now()) FROM triage.outbox_claims")
        )

    def close(self) -> None:
        pass


@pytest.mark.own_database  # the relay reads only committed events
def test_a_trailing_claim_runs_out_before_classify_s_retry_comes(store: JobStore, payloads: PayloadStore) -> None:
    """A try SIGKILLed mid-send leaves its claim: it must have run out when the retry's
    publish_events comes (Airflow's retry_delay, 30 s), or the watermark waits 5 minutes behind it."""
    from triage.operators.retry import default_args

    register_documents(store, payloads, documents(5), "v", batch_key=BATCH)
    sink = Measuring(store)
    with TrailingRelay(store, sink, actor="w/try1 relay") as relay:
        deadline = time.monotonic() + 10
        while relay.sent < 5 and time.monotonic() < deadline:
            time.sleep(0.05)
    assert relay.sent == 5
    retry_delay = default_args(retries=1, max_retry_delay=timedelta(minutes=1))["retry_delay"]
    assert 0 < float(sink.holds[0]) <= retry_delay.total_seconds()


# -- the operator: the sink of publish_events downstream, the switch -------------------------------

DAY = datetime(2026, 11, 1, tzinfo=UTC)


def operator_context(dag_task: Any) -> dict[str, Any]:
    pushed: dict[str, Any] = {}
    ti = SimpleNamespace(
        dag_id="relay_beside",
        run_id=f"manual__{uuid.uuid4().hex}",
        task_id="classify",
        map_index=0,
        try_number=1,
        pushed=pushed,
        xcom_push=lambda key, value: pushed.__setitem__(key, value),
    )
    return {
        "params": {"documents": 40, "classifier": "keyword"},
        "data_interval_start": DAY,
        "data_interval_end": DAY + timedelta(days=1),
        "ti": ti,
        "task": dag_task,
    }


def run_classify(classify: Any) -> dict[str, Any]:
    """Execute ``classify`` and return its counts (its XCom ``summary``: the return value is what
    it hands ``persist``)."""
    from triage.operators.classify_documents import SUMMARY_KEY

    context = operator_context(classify)
    classify.execute(context)
    summary: dict[str, Any] = context["ti"].pushed[SUMMARY_KEY]
    return summary


def seamed_dag(store: JobStore, payload_base: Path, **publish: Any) -> tuple[Any, Any]:
    """``classify >> publish_events`` in a DAG, the test's database behind their seams."""
    from airflow.sdk import DAG

    from triage.operators.classify_documents import ClassifyDocumentsOperator, PublishEventsOperator

    def seamed(cls: type) -> type:
        class Seamed(cls):
            def get_engine(self) -> sa.Engine:
                return store.engine

            def dispose(self) -> None:  # the test's engine outlives the task
                pass

        return Seamed

    with DAG("relay_beside", schedule=None, start_date=DAY) as dag:
        classify = seamed(ClassifyDocumentsOperator)(task_id="classify", payload_base=str(payload_base))
        publish_events = seamed(PublishEventsOperator)(task_id="publish_events", **publish)
        classify >> publish_events
    return dag, classify


def register_day(store: JobStore, payloads: PayloadStore, n: int, prefix: str = "T") -> None:
    version = KeywordClassifier(Taxonomy.load()).version
    register_documents(
        store, payloads, documents(n, prefix=prefix), version, batch_key=batch_key_for(DAY, DAY + timedelta(days=1))
    )


@pytest.mark.own_database  # the chunks commit from lanes of their own; the relay reads only committed events
def test_classify_relays_through_publish_events_sink_and_the_variable_turns_it_off(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    events = tmp_path / "{{ params.classifier }}-events.jsonl"  # rendered for classify as for publish_events
    _dag, classify = seamed_dag(store, tmp_path / "payloads", event_log=str(events))
    monkeypatch.delenv(f"AIRFLOW_VAR_{RELAY_IN_CLASSIFY_VARIABLE.upper()}", raising=False)

    register_day(store, payloads, 40)
    done = run_classify(classify)
    assert done["claimed"] == 40
    assert done["relayed"] >= 40  # at least the registrations, relayed as the step began
    written = tmp_path / "keyword-events.jsonl"
    assert len(written.read_bytes().splitlines()) == done["relayed"]

    monkeypatch.setenv(f"AIRFLOW_VAR_{RELAY_IN_CLASSIFY_VARIABLE.upper()}", "off")
    before = unsent(store)
    register_day(store, payloads, 60, prefix="U")  # more documents of the day, a second run
    done = run_classify(classify)
    assert (done["claimed"], done["relayed"]) == (60, 0)
    assert unsent(store) == before + 120  # all left to publish_events


@pytest.mark.own_database  # the chunks commit from lanes of their own
def test_a_sink_that_cannot_be_built_never_fails_classify(
    store: JobStore, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    _dag, classify = seamed_dag(store, tmp_path / "payloads", webhook_conn_id="no_such_webhook")
    register_day(store, payloads, 20)
    with caplog.at_level(logging.WARNING):
        done = run_classify(classify)
    assert (done["claimed"], done["relayed"]) == (20, 0)
    assert "no relay beside classify" in caplog.text
    assert unsent(store) == 40


@pytest.mark.own_database  # the chunks commit from lanes of their own
def test_without_publish_events_downstream_classify_relays_nothing(store: JobStore, tmp_path: Path) -> None:
    from triage.operators.classify_documents import ClassifyDocumentsOperator

    class Seamed(ClassifyDocumentsOperator):
        def get_engine(self) -> sa.Engine:
            return store.engine

        def dispose(self) -> None:
            pass

    classify: Any = Seamed(task_id="classify", payload_base=str(tmp_path / "payloads"))
    register_day(store, PayloadStore(tmp_path / "payloads"), 10)
    done = run_classify(classify)
    assert (done["claimed"], done["relayed"]) == (10, 0)
    assert unsent(store) == 20
