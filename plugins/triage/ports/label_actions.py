"""The label action, as the persist step and a reviewer's decision ask for it: one label to apply
at the provider (:class:`LabelRequest`), sent by a :class:`LabelAction`, which raises
:class:`ActionFailed` when the provider did not confirm it.

Every request carries an idempotency key (the job's, or for a reviewer's label the job's with its
review), so that a provider honouring ``Idempotency-Key`` applies the effect once however often
a retry asks; and the label's order: the creation time and id of its job, the same order in which
``document_labels`` lets a newer job's label replace an older one. An edited document is a newer
job; when two of its jobs' actions are in flight at once, a provider that keeps the label of the
highest order ends with the newest, as the ledger does. (The persist step does not send an older
job's label at all once a newer one is recorded: :func:`triage.jobs.sql.reads.label_actions.superseded`.)

The HTTP implementation, and the connection it is configured by, are the adapter room's
(:class:`triage.adapters.http_actions.WebhookLabelAction`).
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from triage.jobs.vocabulary.models import ClaimedJob, LabelWrite

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


class LabelAction(Protocol):
    """Where labels go: the persist step calls it with a claimed job and its label, a reviewer's
    decision sends a :class:`LabelRequest`; both raise :class:`ActionFailed` when the provider
    did not confirm."""

    url: str
    """Where the action sends to (the lineage names it)."""

    def __call__(self, job: ClaimedJob, label: LabelWrite) -> None: ...

    def send(self, request: LabelRequest) -> None: ...

    def close(self) -> None: ...
