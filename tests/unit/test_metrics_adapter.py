"""The Airflow adapter of Triage's metrics: calls reach Airflow's ``Stats`` backend as sent."""

from __future__ import annotations

import os
import tempfile
from typing import Any

import pytest

# Airflow writes a config into its home at import: never the user's ~/airflow.
os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="triage-airflow-home-"))

from airflow.sdk._shared.observability.metrics import stats as stats_module
from airflow.sdk.observability import stats

from triage.observability import observe_states
from triage.operators.metrics import AirflowStatsMetrics


class Backend:
    """A Stats backend that keeps what it is sent (what StatsD or OpenTelemetry would get)."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, Any]] = []

    def incr(self, stat: str, count: int = 1, rate: float = 1, *, tags: Any = None) -> None:
        self.calls.append(("incr", stat, count, tags))

    def gauge(self, stat: str, value: float, rate: float = 1, delta: bool = False, *, tags: Any = None) -> None:
        self.calls.append(("gauge", stat, value, tags))

    def timing(self, stat: str, dt: Any, *, tags: Any = None) -> None:
        self.calls.append(("timing", stat, dt, tags))


@pytest.fixture
def backend(monkeypatch: pytest.MonkeyPatch) -> Backend:
    sent = Backend()
    # initialize() is Airflow's own seam (the task runner calls it); monkeypatch restores the
    # module state afterwards so other tests see the default backend again.
    monkeypatch.setattr(stats_module, "_factory", None)
    monkeypatch.setattr(stats_module, "_backend", None)
    monkeypatch.setattr(stats_module, "_export_legacy_names", False)
    stats.initialize(factory=lambda: sent, export_legacy_names=False)  # type: ignore[arg-type,return-value]  # a recording stand-in for Airflow's StatsD logger
    return sent


def test_calls_reach_the_backend_with_names_values_and_tags(backend: Backend) -> None:
    metrics = AirflowStatsMetrics(enabled=True)
    metrics.incr("triage.classify.jobs.completed", 7, {"step": "classify"})
    metrics.timing("triage.classify.latency_ms", 12.5, {"step": "classify"})
    metrics.gauge("triage.batch.queued", 3, None)
    assert backend.calls == [
        ("incr", "triage.classify.jobs.completed", 7, {"step": "classify"}),
        ("timing", "triage.classify.latency_ms", 12.5, {"step": "classify"}),
        ("gauge", "triage.batch.queued", 3, None),
    ]


def test_state_gauges_cover_every_state(backend: Backend) -> None:
    from triage.jobs.vocabulary.states import JobStatus

    observe_states(AirflowStatsMetrics(enabled=True), "classify", "b", {JobStatus.COMPLETED: 5})
    sent = {stat: value for _kind, stat, value, _tags in backend.calls}
    assert sent == {f"triage.batch.{s.value}": (5 if s is JobStatus.COMPLETED else 0) for s in JobStatus}


def test_enabled_follows_the_metrics_config(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "False")
    monkeypatch.setenv("AIRFLOW__METRICS__OTEL_ON", "False")
    assert AirflowStatsMetrics().enabled is False
    monkeypatch.setenv("AIRFLOW__METRICS__STATSD_ON", "True")
    assert AirflowStatsMetrics().enabled is True
