"""External actions of the persist step: effects outside the ledger (a webhook, a ticket).

An action runs before its job's outcome is recorded, so a worker that dies in between runs it
again on retry. Every request therefore carries an idempotency key (the job's, or for a
reviewer's label the job's with its review), and a provider that honours ``Idempotency-Key``
applies the effect once however often it is asked.

Every request also carries the label's order: the creation time and id of the job it belongs
to, the same order in which ``document_labels`` lets a newer job's label replace an older one.
An edited document is a newer job; when two of its jobs' actions are in flight at once, a
provider that keeps the label of the highest order ends with the newest, as the ledger does.
(The persist step does not send an older job's label at all once a newer one is recorded:
:func:`triage.jobs.label_actions.superseded`.)
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import httpx

from triage.jobs.models import ClaimedJob, LabelWrite
from triage.tracing import correlation_header

ORDER_HEADER = "X-Label-Order"


def label_order(job_created_at: datetime, job_id: uuid.UUID) -> str:
    """``<job created_at, UTC, microseconds>Z/<job id>``: sorts as text exactly as the ledger
    orders label writes (by ``job_created_at``, then ``job_id``)."""
    return f"{job_created_at.astimezone(UTC):%Y-%m-%dT%H:%M:%S.%fZ}/{job_id}"


@dataclass(frozen=True, slots=True)
class LabelRequest:
    """One label to apply at the provider, under ``idempotency_key``."""

    idempotency_key: str
    job_id: uuid.UUID
    job_created_at: datetime
    source: str
    external_id: str
    correlation_id: str
    label: str
    confidence: float | None
    classifier_version: str
    revision: int | None = None
    """A reviewer's correction of a label already sent for this job (the review row's id): its
    order sorts after the job's own, so that the provider ends with the correction."""

    @classmethod
    def for_job(cls, job: ClaimedJob, label: LabelWrite) -> LabelRequest:
        """The model's label of a claimed job, under the job's idempotency key."""
        return cls(
            job.idempotency_key,
            job.id,
            job.created_at,
            job.source,
            job.external_id,
            job.correlation_id,
            label.label,
            label.confidence,
            label.classifier_version,
        )

    @property
    def order(self) -> str:
        """:func:`label_order`; for a correction ``/<revision, 20 digits>`` after it, which sorts
        after the bare order of the same job and after its earlier corrections."""
        order = label_order(self.job_created_at, self.job_id)
        return order if self.revision is None else f"{order}/{self.revision:020d}"


class ActionFailed(Exception):
    """The provider did not confirm the action; the job's attempt is retried.

    :param error_class: what failed, as the classifier's errors name it: ``connection_error``,
        ``timeout`` and ``server_error`` (5xx) say the provider is down (the persist step's
        circuit breaker counts them: :data:`triage.pipeline.breaker.DEPENDENCY_DOWN`);
        ``rate_limited`` (429) and ``rejected`` (another status) say it answered.
    """

    def __init__(self, message: str, error_class: str = "rejected") -> None:
        super().__init__(message)
        self.error_class = error_class


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
    """POSTs ``{"job_id", "source", "external_id", "label", "confidence", "classifier_version",
    "job_created_at", "label_order"}`` with ``Idempotency-Key`` and ``X-Label-Order``."""

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
