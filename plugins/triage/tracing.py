"""OpenTelemetry spans of Triage's work, inside Airflow 3's task spans.

With tracing on in Airflow (``[traces] otel_on``), the task runner makes a span per task try
(``worker.<task_id>``, attributes ``airflow.dag_id``, ``airflow.task_id``, …) and makes it
current while the operator runs; the global tracer provider exports it. A task works on many
jobs, so that span cannot carry one job's ids: Triage adds, under it,

- a span per claimed batch (``triage.<step>.batch``): the step, the batch key, how many jobs,
  and their ``triage.job_ids`` and ``triage.correlation_ids`` (lists of strings);
- a span per model call (``triage.model_call``): one job's ``triage.job_id``,
  ``triage.correlation_id``, ``triage.attempt``, the model and the HTTP status; the call
  carries the W3C ``traceparent`` of that span, so a tracing proxy in front of the model joins
  the trace.

With tracing off the tracer is OpenTelemetry's no-op one: a span costs a few microseconds and
no attribute is built (:meth:`Span.is_recording`). Attributes are ids, codes and counts: never
a document, a prompt or a credential. Nothing here imports Airflow.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, MutableMapping, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace

from triage.jobs.vocabulary.models import ClaimedJob

TRACER = "triage"
_HEADER_SAFE = re.compile(r"[!-~]{1,128}")
"""Visible ASCII without spaces, at most 128 characters: what a header value can carry as is."""


def tracer() -> trace.Tracer:
    """The tracer of the global provider (Airflow's, when its tracing is on), asked each time:
    the provider may be set after this module is imported."""
    return trace.get_tracer(TRACER)


def annotate_current_span(step: str, batch_key: str) -> None:
    """Name the step and batch on the current span (a task's ``worker.<task_id>``): its jobs'
    ids are on the batch spans under it."""
    set_attributes(trace.get_current_span(), {"triage.step": step, "triage.batch_key": batch_key})


@contextmanager
def batch_span(step: str, batch_key: str, jobs: Sequence[ClaimedJob]) -> Iterator[trace.Span]:
    """The span of one claimed batch's handling, a child of the current span (the task's)."""
    # Exceptions are not recorded: their messages are not ours to vouch for (a provider's
    # error detail); the error class says enough (set_error).
    with tracer().start_as_current_span(
        f"triage.{step}.batch", record_exception=False, set_status_on_exception=False
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "triage.step": step,
                    "triage.batch_key": batch_key,
                    "triage.jobs": len(jobs),
                    "triage.job_ids": [str(job.id) for job in jobs],
                    "triage.correlation_ids": sorted({job.correlation_id for job in jobs}),
                }
            )
        yield span


@contextmanager
def model_call_span(job_id: str, correlation_id: str, attempt: int, model: str) -> Iterator[trace.Span]:
    """The span of one model call, for one job."""
    with tracer().start_as_current_span(
        "triage.model_call", kind=trace.SpanKind.CLIENT, record_exception=False, set_status_on_exception=False
    ) as span:
        if span.is_recording():
            span.set_attributes(
                {
                    "triage.job_id": job_id,
                    "triage.correlation_id": correlation_id,
                    "triage.attempt": attempt,
                    "gen_ai.request.model": model,
                }
            )
        yield span


def inject_trace_headers(headers: MutableMapping[str, str]) -> None:
    """Add the current span's ``traceparent`` (and ``tracestate``) to outgoing headers; nothing
    when no span is recording."""
    if trace.get_current_span().is_recording():
        propagate.inject(headers)


def set_attributes(span: trace.Span, attributes: dict[str, Any]) -> None:
    if span.is_recording():
        span.set_attributes(attributes)


def correlation_header(correlation_id: str) -> str:
    """The ``X-Correlation-ID`` value of an outgoing call: the id itself when it is visible
    ASCII of at most 128 characters (ids Triage mints, and what intake accepts), else
    ``sha256:`` and the first 32 hex digits of its digest, so that a client's odd id (spaces,
    newlines, non-ASCII) can never break or forge a header, and still names the job stably."""
    if _HEADER_SAFE.fullmatch(correlation_id):
        return correlation_id
    return "sha256:" + hashlib.sha256(correlation_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


def set_error(span: trace.Span, error_class: str) -> None:
    """Mark ``span`` failed with a code (``error.type``), never an exception's message."""
    if span.is_recording():
        span.set_attribute("error.type", error_class)
        span.set_status(trace.Status(trace.StatusCode.ERROR, error_class))
