"""The HTTP actions a connection configures: the label provider (``triage_label_action``), the
event sink's webhook and the alerts' webhook (``triage_alerts``).

Why not the HTTP provider's ``HttpHook``: its rules do not fit these connections. It sends every
key of a connection's extra that it does not know as a request header, and Triage's extras carry
settings (``timeout`` it knows, but ``headers``, ``format``, thresholds it would send as headers,
a dict among them); it is a ``requests`` session per hook, where the label action is one pooled
``httpx`` client shared by the persist step's calls and by the web service's threads; and the
persist step's circuit breaker needs the transport's error classes (refused, timed out, 5xx)
that :class:`WebhookLabelAction` reads from ``httpx``. So the connection is read here, once,
and becomes a plain client; the clients take a URL and settings, no Airflow.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC
from typing import TYPE_CHECKING, Any

import httpx
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import AirflowFailException

from triage.adapters.connections import http_url, variable
from triage.ports.label_actions import ORDER_HEADER, ActionFailed, LabelRequest
from triage.tracing import correlation_header

if TYPE_CHECKING:
    from triage.alerts import AlertDelivery, Thresholds
    from triage.jobs.vocabulary.models import ClaimedJob, LabelWrite
    from triage.pipeline.publish import EventSink

log = logging.getLogger(__name__)

LABEL_ACTION_CONN_ID = "triage_label_action"
"""An HTTP connection whose host is the URL each label is POSTed to (with its idempotency key
and order): a model's accepted label before its job completes, a reviewer's after the decision.
Unset means no external action."""

ALERTS_CONN_ID = "triage_alerts"


def _error_class(exc: httpx.HTTPError) -> str:
    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.TransportError):  # refused, reset, DNS: nothing answered
        return "connection_error"
    return "rejected"


def _status_class(status: int) -> str:
    if status >= 500:
        return "server_error"
    return "rate_limited" if status == 429 else "rejected"


class WebhookLabelAction:
    """The :class:`~triage.ports.label_actions.LabelAction` over HTTP: POSTs ``{"job_id",
    "source", "external_id", "label", "confidence", "classifier_version", "job_created_at",
    "label_order"}`` with ``Idempotency-Key`` and ``X-Label-Order``."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})

    def __call__(self, job: ClaimedJob, label: LabelWrite) -> None:
        self.send(LabelRequest.for_job(job, label))

    def send(self, request: LabelRequest) -> None:
        order = request.order
        body = {
            "job_id": str(request.job_id),
            "source": request.source,
            "external_id": request.external_id,
            "label": request.label,
            "confidence": request.confidence,
            "classifier_version": request.classifier_version,
            "job_created_at": request.job_created_at.astimezone(UTC).isoformat(),
            "label_order": order,
        }
        headers = {
            "Idempotency-Key": request.idempotency_key,
            "X-Correlation-ID": correlation_header(request.correlation_id),
            ORDER_HEADER: order,
        }
        try:
            response = self._client.post(self.url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ActionFailed(f"{type(exc).__name__} calling the action endpoint", _error_class(exc)) from None
        if response.status_code >= 300:
            raise ActionFailed(
                f"HTTP {response.status_code} from the action endpoint", _status_class(response.status_code)
            )

    def close(self) -> None:
        self._client.close()


def label_action_connection(conn_id: str | None) -> Any:
    """The label action's connection, or None when it is not configured."""
    from airflow.sdk.exceptions import AirflowNotFoundException

    if not conn_id:
        return None
    try:
        return BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return None


def build_label_action(conn_id: str | None) -> WebhookLabelAction | None:
    """The label action of the connection (extra ``timeout`` in seconds, ``headers``), or None
    when it is not configured. A timeout that is not a number fails the task without retry."""
    conn = label_action_connection(conn_id)
    if conn is None:
        return None
    extra = conn.extra_dejson or {}
    try:
        timeout = float(extra.get("timeout", 10.0))
    except (TypeError, ValueError):
        raise AirflowFailException(
            f"the {conn_id} connection's extra timeout is not a number; fix it, then clear this task"
        ) from None
    return WebhookLabelAction(http_url(conn), timeout_s=timeout, headers=extra.get("headers"))


def default_label_action() -> WebhookLabelAction | None:
    """The ``triage_label_action`` connection's action, when it exists (as ``review_jobs``)."""
    return build_label_action(LABEL_ACTION_CONN_ID)


def event_sink(webhook_conn_id: str | None, event_log: str | None) -> EventSink:
    """Where events go: the webhook of an HTTP connection when one is named, else the JSON-lines
    event log (``event_log``, then Variable ``triage_event_sink``, then the deployment's default)."""
    from triage import settings
    from triage.pipeline.publish import JsonlEventSink, WebhookEventSink

    if webhook_conn_id:
        conn = BaseHook.get_connection(webhook_conn_id)
        return WebhookEventSink(http_url(conn), headers=(conn.extra_dejson or {}).get("headers"))
    return JsonlEventSink(settings.event_log(event_log or variable("triage_event_sink")))


@dataclass(frozen=True, slots=True)
class AlertRoute:
    """Where alerts go and when they are raised, as the ``triage_alerts`` connection says."""

    delivery: AlertDelivery
    thresholds: Thresholds


def alert_route(conn_id: str = ALERTS_CONN_ID) -> AlertRoute:
    """The webhook and thresholds of the connection; the log and the defaults without one.

    A setting out of range is logged as an ERROR and its default used: an alert is still owed.
    """
    from airflow.sdk.exceptions import AirflowNotFoundException

    from triage.alerts import InvalidAlertSettings, LogAlerts, Thresholds, WebhookAlerts

    try:
        connection = BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return AlertRoute(LogAlerts(), Thresholds())
    extra = connection.extra_dejson or {}
    try:
        thresholds = Thresholds.from_settings(extra)
    except InvalidAlertSettings as exc:
        log.error("the %s connection's thresholds are invalid (%s); the defaults apply", conn_id, exc)
        thresholds = Thresholds()
    try:
        timeout = float(extra.get("timeout", 5.0))
    except (TypeError, ValueError):
        log.error("the %s connection's extra timeout is not a number; 5 s applies", conn_id)
        timeout = 5.0
    webhook = WebhookAlerts(
        http_url(connection),
        headers=extra.get("headers"),
        timeout_s=timeout,
        fmt=str(extra.get("format", "json")),
        where=f"{conn_id} webhook",
    )
    return AlertRoute(webhook, thresholds)
