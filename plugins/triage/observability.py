"""Metrics and per-job log lines of the step runner, without Airflow.

The pipeline reports through a :class:`Metrics` sink it is given: :data:`NULL_METRICS` by
default (benchmarks, the CLI, tests that do not look), Airflow's ``Stats`` in the operators
(:class:`triage.operators.metrics.AirflowStatsMetrics`), a :class:`RecordingMetrics` in tests.
Every name is listed in ``docs/observability.md``.

The hot path stays cheap: a batch is summarised once (one ``incr`` per kind with its count,
never one call per document), and nothing is computed at all when the sink is disabled. The
per-classification latency timings are the one exception (a timer needs its samples) and are
sent only to an enabled sink.

Log lines name jobs by id and ``correlation_id`` with states and result classes; never the
document, its external id (it comes from outside and may hold anything, newlines included),
an error message (it may echo input) or a credential.

A per-job line carries ``job_id``, ``correlation_id``, ``attempt`` and ``max_attempts`` as
structured fields, not in its text (:func:`log_job`): bound with ``structlog``'s context
variables for the line, which Airflow 3's task logger merges into each JSON line of the task
log (``structlog.contextvars.merge_contextvars`` is in its processor chain for stdlib records
too), so they are keys a log search can filter on; and as the record's ``extra`` attributes for
any other stdlib handler. A client-supplied correlation id thus never becomes log text.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from structlog.contextvars import bound_contextvars

from triage.jobs.vocabulary.models import (
    Advance,
    ClaimedJob,
    Complete,
    Fail,
    Outcome,
    Park,
    Release,
    RetryLater,
    SendToReview,
)
from triage.jobs.vocabulary.states import JobStatus

PREFIX = "triage"

ROUTES: Mapping[type, str] = {
    Complete: "completed",
    Advance: "advanced",
    RetryLater: "retry",
    SendToReview: "review",
    Fail: "failed",
    Release: "released",
    Park: "parked",
}
"""Where an outcome sends its job: the last part of ``triage.<step>.jobs.<route>``."""

_UNSAFE = re.compile(r"[^a-z0-9_]+")
MAX_CLASS_LENGTH = 32  # keeps every name within OpenTelemetry's 63 characters, with "airflow."


def metric_part(value: str) -> str:
    """A free-form code (an error class) as one safe part of a metric name."""
    return _UNSAFE.sub("_", value.lower()).strip("_")[:MAX_CLASS_LENGTH] or "unknown"


class Metrics(Protocol):
    """Where the pipeline's counters, gauges and timers go. ``enabled`` False: skip the work."""

    enabled: bool

    def incr(self, name: str, count: int = 1, tags: Mapping[str, str] | None = None) -> None: ...

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None: ...

    def timing(self, name: str, milliseconds: float, tags: Mapping[str, str] | None = None) -> None: ...


class NullMetrics:
    """Discards everything; the default."""

    enabled = False

    def incr(self, name: str, count: int = 1, tags: Mapping[str, str] | None = None) -> None:
        pass

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        pass

    def timing(self, name: str, milliseconds: float, tags: Mapping[str, str] | None = None) -> None:
        pass


NULL_METRICS = NullMetrics()


@dataclass(frozen=True, slots=True)
class Sample:
    kind: str  # "incr" | "gauge" | "timing"
    name: str
    value: float
    tags: Mapping[str, str]


@dataclass
class RecordingMetrics:
    """Keeps every call, for tests (and for reading what a run would have sent)."""

    enabled: bool = True
    samples: list[Sample] = field(default_factory=list)

    def incr(self, name: str, count: int = 1, tags: Mapping[str, str] | None = None) -> None:
        self.samples.append(Sample("incr", name, count, dict(tags or {})))

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        self.samples.append(Sample("gauge", name, value, dict(tags or {})))

    def timing(self, name: str, milliseconds: float, tags: Mapping[str, str] | None = None) -> None:
        self.samples.append(Sample("timing", name, milliseconds, dict(tags or {})))

    def counters(self) -> dict[str, float]:
        """Counter name -> total of its increments."""
        totals: Counter[str] = Counter()
        for s in self.samples:
            if s.kind == "incr":
                totals[s.name] += s.value  # type: ignore[assignment]
        return dict(totals)

    def gauges(self) -> dict[str, float]:
        """Gauge name -> its last value."""
        return {s.name: s.value for s in self.samples if s.kind == "gauge"}

    def timings(self, name: str) -> list[float]:
        return [s.value for s in self.samples if s.kind == "timing" and s.name == name]


def observe_batch(metrics: Metrics, step: str, outcomes: Sequence[Outcome], handled_seconds: float) -> None:
    """Counters of one batch's outcomes: routes, model outcomes, error classes; and timings.

    ``triage.<step>.jobs.<route>``, ``triage.<step>.outcome.<accepted|inconclusive|rejected>``,
    ``triage.<step>.transient.<error_class>`` / ``triage.<step>.permanent.<error_class>``,
    ``triage.<step>.latency_ms`` (one sample per classification), ``triage.<step>.batch_ms``.
    """
    if not metrics.enabled:
        return
    routes: Counter[str] = Counter()
    model: Counter[str] = Counter()
    errors: Counter[tuple[str, str]] = Counter()
    latencies: list[float] = []
    for outcome in outcomes:
        routes[ROUTES[type(outcome)]] += 1
        record = getattr(outcome, "classification", None)
        if record is not None:
            model[record.outcome] += 1
            if record.latency_ms is not None:
                latencies.append(record.latency_ms)
        elif isinstance(outcome, RetryLater):
            errors["transient", outcome.error_class] += 1
        elif isinstance(outcome, SendToReview | Fail):
            errors["permanent", outcome.error_class or outcome.reason] += 1
    tags = {"step": step}
    metrics.incr(f"{PREFIX}.{step}.claimed", len(outcomes), tags)
    for route, n in routes.items():
        metrics.incr(f"{PREFIX}.{step}.jobs.{route}", n, tags)
    for name, n in model.items():
        metrics.incr(f"{PREFIX}.{step}.outcome.{name}", n, tags)
    for (kind, error_class), n in errors.items():
        metrics.incr(f"{PREFIX}.{step}.{kind}.{metric_part(error_class)}", n, {**tags, "error_class": error_class})
    for ms in latencies:
        metrics.timing(f"{PREFIX}.{step}.latency_ms", ms, tags)
    metrics.timing(f"{PREFIX}.{step}.batch_ms", handled_seconds * 1000.0, tags)


def observe_exhausted(metrics: Metrics, step: str, exhausted: int) -> None:
    """``triage.<step>.retries_exhausted``: retries that went to review instead (known once recorded)."""
    if exhausted and metrics.enabled:
        metrics.incr(f"{PREFIX}.{step}.retries_exhausted", exhausted, {"step": step})


def observe_states(metrics: Metrics, step: str, batch_key: str, counts: Mapping[JobStatus, int]) -> None:
    """Gauges ``triage.batch.<state>`` of the batch's jobs at the end of a step (every state,
    zeros included, so a gauge falls back when its jobs move on)."""
    tags = {"step": step, "batch_key": batch_key}
    for state in JobStatus:
        metrics.gauge(f"{PREFIX}.batch.{state.value}", counts.get(state, 0), tags)


# -- logs -----------------------------------------------------------------------------------


def job_log_fields(job: ClaimedJob) -> dict[str, Any]:
    """The structured fields of every per-job line: ``job_id``, ``correlation_id``, ``attempt``, ``max_attempts``."""
    return {
        "job_id": str(job.id),
        "correlation_id": job.correlation_id,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
    }


@contextmanager
def job_context(job: ClaimedJob) -> Iterator[dict[str, Any]]:
    """Every line logged inside carries the job's fields (Airflow's JSON task log: as keys)."""
    fields = job_log_fields(job)
    with bound_contextvars(**fields):
        yield fields


def log_job(log: logging.Logger, level: int, job: ClaimedJob, msg: str, *args: object) -> None:
    """One per-job line: ``msg`` (states, codes; never a document or an error's text) with the
    job's fields bound for it (:func:`job_context`) and as the record's ``extra``."""
    if not log.isEnabledFor(level):
        return
    with job_context(job) as fields:
        log.log(level, msg, *args, extra=fields)


def log_job_outcomes(log: logging.Logger, step: str, jobs: Sequence[ClaimedJob], outcomes: Sequence[Outcome]) -> None:
    """One line per job that did not simply succeed: retries and failures (WARNING), review
    routing (INFO for a model's doubt, WARNING for a failure), releases (INFO). Accepted jobs are
    counted, not logged one by one. Each line carries its job's fields (:func:`log_job`)."""
    if not log.isEnabledFor(logging.INFO):
        return
    by_id = {job.id: job for job in jobs}
    for outcome in outcomes:
        if isinstance(outcome, Complete | Advance):
            continue
        job = by_id.get(outcome.job_id)
        if job is None:  # pragma: no cover - an outcome always answers a claimed job
            continue
        if isinstance(outcome, RetryLater):
            # The store sends a retry of the last attempt to review instead (retries_exhausted).
            spent = job.attempt >= job.max_attempts
            then = f"{JobStatus.MANUAL_REVIEW.value} (retries_exhausted)" if spent else JobStatus.RETRYABLE_FAILED.value
            log_job(log, logging.WARNING, job, "step=%s retry error_class=%s -> %s", step, outcome.error_class, then)
        elif isinstance(outcome, SendToReview):
            # A model's doubt is routine (INFO); a failure that needs a person is not (WARNING).
            level = logging.INFO if outcome.classification is not None else logging.WARNING
            log_job(
                log,
                level,
                job,
                "step=%s manual_review reason=%s error_class=%s",
                step,
                outcome.reason,
                outcome.error_class,
            )
        elif isinstance(outcome, Fail):
            log_job(
                log,
                logging.WARNING,
                job,
                "step=%s terminal_failed reason=%s error_class=%s",
                step,
                outcome.reason,
                outcome.error_class,
            )
        elif isinstance(outcome, Park):
            log_job(
                log,
                logging.INFO,
                job,
                "step=%s parked reason=outage:%s error_class=%s",
                step,
                outcome.dependency,
                outcome.error_class,
            )
        else:
            log_job(log, logging.INFO, job, "step=%s released", step)
