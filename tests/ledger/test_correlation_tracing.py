"""A job's correlation id on its way out: the model call's header, the spans of the classify
step under the task's span (an in-memory OpenTelemetry exporter stands in for a collector), and
the events the relay publishes. The fake OpenAI-compatible server records every header."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from tests.fakes.openai_server import FakeOpenAIServer, Reply, fixed_label
from tests.ledger.helpers import classify_try, documents, llm_classifier
from triage.contracts.events import WorkEvent
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifySettings
from triage.pipeline.retrieve import to_new_jobs
from triage.pipeline.steps import RunSettings
from triage.tracing import correlation_header

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
HOSTILE = "client id\r\nX-Injected: 1"  # a client's id that is no header value


def attributes(span: ReadableSpan) -> Mapping[str, Any]:
    """A finished span's attributes (OpenTelemetry types them as optional)."""
    assert span.attributes is not None, span.name
    return span.attributes


@pytest.fixture(scope="module")
def exporter() -> InMemorySpanExporter:
    """An exporter on the global provider (set once per process: OpenTelemetry refuses a second)."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def spans(exporter: InMemorySpanExporter) -> Iterator[InMemorySpanExporter]:
    exporter.clear()
    yield exporter
    exporter.clear()


def run_classify(store: JobStore, tmp_path: Path, server: FakeOpenAIServer, correlation: list[str]) -> trace.Span:
    payloads = PayloadStore(tmp_path / "payloads")
    classifier = llm_classifier(server)
    docs = documents(len(correlation), "charged twice {i}")
    new = [
        dataclasses.replace(job, correlation_id=c)
        for job, c in zip(to_new_jobs(docs, payloads, classifier.version), correlation, strict=True)
    ]
    store.register(new, batch_key=BATCH, step="classify", max_attempts=3)
    settings = RunSettings(owner="t", batch_size=5, lease_seconds=60)
    # Airflow's task runner makes the task's span current while the operator runs.
    with trace.get_tracer("airflow.sdk.execution_time.task_runner").start_as_current_span("worker.classify") as task:
        classify_try(store, classifier, payloads, settings, batch_key=BATCH, classify=ClassifySettings(concurrency=4))
    return task


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_the_correlation_id_reaches_the_model_call_the_spans_and_the_events(
    store: JobStore, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    correlation = [f"client-{i}" for i in range(11)] + [HOSTILE]
    with FakeOpenAIServer(responder=fixed_label("billing", 0.92)) as server:
        task = run_classify(store, tmp_path, server, correlation)
        sent = [{k.lower(): v for k, v in h.items()} for h in server.headers]
    finished: list[ReadableSpan] = list(spans.get_finished_spans())
    by_id = {s.context.span_id: s for s in finished}
    batches = [s for s in finished if s.name == "triage.classify.batch"]
    calls = [s for s in finished if s.name == "triage.model_call"]

    # the model call: the header (a hostile id as its digest), and the span's traceparent
    assert sorted(h["x-correlation-id"] for h in sent) == sorted(correlation_header(c) for c in correlation)
    assert correlation_header(HOSTILE).startswith("sha256:")
    traceparents = {h["traceparent"].rsplit("-", 1)[0] for h in sent}  # version, trace id, span id
    assert traceparents == {f"00-{c.context.trace_id:032x}-{c.context.span_id:016x}" for c in calls}

    # the spans: a batch span per claim under the task's span, a model call span per job under its batch
    task_id = task.get_span_context().span_id
    [task_span] = [s for s in finished if s.context.span_id == task_id]
    assert (attributes(task_span)["triage.step"], attributes(task_span)["triage.batch_key"]) == ("classify", BATCH)
    assert len(batches) == 3  # 12 jobs, claims of 5
    assert all(b.parent is not None and b.parent.span_id == task_id for b in batches)
    assert sorted(c for b in batches for c in attributes(b)["triage.correlation_ids"]) == sorted(correlation)
    assert sum(attributes(b)["triage.jobs"] for b in batches) == 12
    assert len(calls) == 12
    for call in calls:
        assert call.parent is not None
        parent = by_id[call.parent.span_id]
        assert parent.name == "triage.classify.batch"
        assert attributes(call)["triage.correlation_id"] in attributes(parent)["triage.correlation_ids"]
        assert attributes(call)["http.response.status_code"] == 200
    assert sorted(attributes(c)["triage.correlation_id"] for c in calls) == sorted(correlation)

    # the events: every one of a job carries its correlation id
    events: list[WorkEvent] = []
    store.relay(events.extend)
    assert {e.correlation_id for e in events} == set(correlation)
    assert {e.event_type for e in events} == {"job.registered", "job.completed"}


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_failed_call_marks_its_span_with_the_error_class_only(
    store: JobStore, tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    with FakeOpenAIServer(responder=lambda _body: Reply.status_only(400)) as server:
        run_classify(store, tmp_path, server, ["c-0"])
    calls = [s for s in spans.get_finished_spans() if s.name == "triage.model_call"]
    assert calls
    for call in calls:
        assert attributes(call)["error.type"] == "bad_request"
        assert call.status.status_code == trace.StatusCode.ERROR
        assert call.events == ()  # no exception recorded: its message is not ours to export
