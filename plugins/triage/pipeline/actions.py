"""External actions of the persist step: effects outside the ledger (a webhook, a ticket).

An action runs before its job's outcome is recorded, so a worker that dies in between runs it
again on retry. Every request therefore carries the job's idempotency key, and a provider that
honours ``Idempotency-Key`` applies the effect once however often it is asked.
"""

from __future__ import annotations

import httpx

from triage.jobs.models import ClaimedJob, LabelWrite


class ActionFailed(Exception):
    """The provider did not confirm the action; the job's attempt is retried."""


class WebhookLabelAction:
    """POSTs ``{"job_id", "external_id", "label", "confidence"}`` with ``Idempotency-Key``."""

    def __init__(self, url: str, *, timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        self.url = url
        self._client = httpx.Client(timeout=timeout_s, headers=headers or {})

    def __call__(self, job: ClaimedJob, label: LabelWrite) -> None:
        body = {"job_id": str(job.id), "source": job.source, "external_id": job.external_id, "label": label.label,
                "confidence": label.confidence, "classifier_version": label.classifier_version}  # fmt: skip
        headers = {"Idempotency-Key": job.idempotency_key, "X-Correlation-ID": job.correlation_id}
        try:
            response = self._client.post(self.url, json=body, headers=headers)
        except httpx.HTTPError as exc:
            raise ActionFailed(f"{type(exc).__name__} calling the action endpoint") from None
        if response.status_code >= 300:
            raise ActionFailed(f"HTTP {response.status_code} from the action endpoint")

    def close(self) -> None:
        self._client.close()
