"""Triage's metrics sink on Airflow's metrics API (``airflow.sdk.observability.stats.Stats``).

Airflow sends them to StatsD, Datadog or OpenTelemetry as ``[metrics]`` configures, with its
``metric_prefix`` (default ``airflow``) in front; with no backend, ``Stats`` discards them and
:attr:`AirflowStatsMetrics.enabled` is False, so the pipeline does not even count.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow.sdk import conf
from airflow.sdk.observability.stats import Stats

BACKENDS = ("statsd_on", "statsd_datadog_enabled", "otel_on")


def metrics_backend_enabled() -> bool:
    """Whether ``[metrics]`` turns a backend on (StatsD, Datadog or OpenTelemetry)."""
    return any(conf.getboolean("metrics", option, fallback=False) for option in BACKENDS)


class AirflowStatsMetrics:
    """:class:`triage.observability.Metrics` on Airflow's ``Stats``. Tags go along for backends
    that keep them (Datadog, OpenTelemetry, StatsD with InfluxDB tags); the names carry every
    dimension for plain StatsD except the batch of the ``triage.batch.<state>`` gauges, which
    only a tag names (see docs/observability.md)."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = metrics_backend_enabled() if enabled is None else enabled

    def incr(self, name: str, count: int = 1, tags: Mapping[str, str] | None = None) -> None:
        Stats.incr(name, count, tags=dict(tags) if tags else None)

    def gauge(self, name: str, value: float, tags: Mapping[str, str] | None = None) -> None:
        Stats.gauge(name, value, tags=dict(tags) if tags else None)

    def timing(self, name: str, milliseconds: float, tags: Mapping[str, str] | None = None) -> None:
        Stats.timing(name, milliseconds, tags=dict(tags) if tags else None)
