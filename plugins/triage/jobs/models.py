"""Frozen domain objects that go into and come out of the store."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from triage.jobs.states import JobStatus


def batch_key_for(start: datetime, end: datetime) -> str:
    """The batch key of a data interval, ``start/end`` in ISO 8601: what ``jobs.batch_key`` holds
    for a ``classify_documents`` run, and how callbacks, reports and the CLI name its jobs."""
    return f"{start.isoformat()}/{end.isoformat()}"


@dataclass(frozen=True, slots=True)
class NewJob:
    """One document to register. ``status`` is ``queued``, or ``manual_review`` for input that
    is malformed on arrival (then ``reason`` and ``review_context`` say why)."""

    idempotency_key: str
    source: str
    external_id: str
    content_sha256: str
    payload_ref: str
    classifier_version: str
    correlation_id: str | None = None  # None: the job's own id
    status: JobStatus = JobStatus.QUEUED
    reason: str | None = None
    error: str | None = None
    review_context: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Registered:
    new: int
    existing: int
    new_ids: tuple[uuid.UUID, ...] = ()


@dataclass(frozen=True, slots=True)
class ClaimedJob:
    id: uuid.UUID
    idempotency_key: str
    source: str
    external_id: str
    content_sha256: str
    payload_ref: str
    classifier_version: str
    correlation_id: str
    step: str
    attempt: int
    max_attempts: int
    created_at: datetime
    attempt_base: int = 0  # where the current attempt budget began (see jobs.schema)

    @property
    def attempt_in_budget(self) -> int:
        """1 for the first attempt since registration, the last advance or the last requeue."""
        return self.attempt - self.attempt_base


@dataclass(frozen=True, slots=True)
class Claim:
    """A batch of jobs held under one lease token until ``expires_at``."""

    token: uuid.UUID
    owner: str
    expires_at: datetime
    jobs: tuple[ClaimedJob, ...]

    def __len__(self) -> int:
        return len(self.jobs)


@dataclass(frozen=True, slots=True)
class ClassificationRecord:
    label: str | None
    confidence: float | None
    outcome: Literal["accepted", "inconclusive", "rejected"]
    classifier_version: str
    rejected_reason: str | None = None
    latency_ms: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cost_usd: float | None = None
    usage_discarded: str | None = None  # figures reported out of bounds, comma-separated (triage.jobs.usage)
    output_mode: str | None = None  # json_schema | json_object: how the answer's shape was asked for
    input_sha256: str | None = None  # SHA-256 of the text the classifier read: the content cache's key
    reused_from: tuple[uuid.UUID, int] | None = None
    """The classification (job id, attempt) this answer was copied from by the content cache;
    None: the classifier's own answer."""
    candidates: tuple[tuple[str, float], ...] | None = None
    """The model's top labels with their scores, best first (``classifications.candidates``);
    None: the classifier gave none (an LLM's one label)."""


@dataclass(frozen=True, slots=True)
class LabelWrite:
    """The business output of a completed job: one row of ``document_labels``."""

    label: str
    confidence: float | None
    classifier_version: str


# Outcomes of an attempt. Each names the job and the attempt it belongs to: the store fences
# every write on (job, attempt, lease token), so a late outcome of an old attempt is refused.


@dataclass(frozen=True, slots=True)
class Complete:
    job_id: uuid.UUID
    attempt: int
    label: LabelWrite | None = None
    classification: ClassificationRecord | None = None
    audit: bool = False
    """An audit sample (:mod:`triage.jobs.audit_samples`): completed as any other, with an open
    review row beside it (only with a ``label``)."""


@dataclass(frozen=True, slots=True)
class Advance:
    """Done with this step; queued for ``next_step`` with a fresh attempt budget."""

    job_id: uuid.UUID
    attempt: int
    next_step: str
    classification: ClassificationRecord | None = None


@dataclass(frozen=True, slots=True)
class RetryLater:
    """A transient failure: ``retryable_failed`` with backoff, or review once attempts run out."""

    job_id: uuid.UUID
    attempt: int
    error_class: str
    error: str | None = None
    delay_seconds: float | None = None  # None: the store's retry policy decides
    classification: ClassificationRecord | None = None


@dataclass(frozen=True, slots=True)
class SendToReview:
    job_id: uuid.UUID
    attempt: int
    reason: str
    error_class: str | None = None
    error: str | None = None
    context: Mapping[str, Any] = field(default_factory=dict)
    classification: ClassificationRecord | None = None


@dataclass(frozen=True, slots=True)
class Fail:
    """A permanent failure with no human in the loop: ``terminal_failed``."""

    job_id: uuid.UUID
    attempt: int
    reason: str
    error_class: str | None = None
    error: str | None = None
    classification: ClassificationRecord | None = None


@dataclass(frozen=True, slots=True)
class Release:
    """Claimed but never started (a circuit breaker opened): back to ``queued``, attempt undone."""

    job_id: uuid.UUID
    attempt: int


@dataclass(frozen=True, slots=True)
class Park:
    """A dependency is down (an outage), not the job: ``waiting`` with reason
    ``outage:<dependency>`` until ``now + delay_seconds``, the attempt given back (it was the
    dependency's failure, not the job's). A claim of its batch queues it again once due."""

    job_id: uuid.UUID
    attempt: int
    dependency: str
    delay_seconds: float
    error_class: str | None = None
    error: str | None = None
    backoff: bool = False
    """Grow the delay with the job's earlier outage parkings (:func:`triage.jobs.outages.outage_due`):
    on when the delay is Triage's default, off for the model's own ``Retry-After``."""


Outcome = Complete | Advance | RetryLater | SendToReview | Fail | Release | Park


@dataclass(frozen=True, slots=True)
class Recorded:
    completed: int = 0
    advanced: int = 0
    retrying: int = 0
    exhausted: int = 0
    to_review: int = 0
    failed: int = 0
    released: int = 0
    parked: int = 0


@dataclass(frozen=True, slots=True)
class LeaseRelease:
    retrying: int
    to_review: int
    job_ids: tuple[uuid.UUID, ...] = ()


REPAIRER = "reconciliation"
"""Who repairs: the actor of reconciliation's transactions (``job_events.actor``), and the
``repaired_by`` and ``resolved_by`` of the rows its repairs write (:mod:`triage.jobs.repairs`)."""


ReviewDecision = Literal["label", "requeue", "reject"]
"""What a reviewer may decide for a job in ``manual_review``."""

REVIEW_RESOLUTIONS: Mapping[str, str] = {"label": "labelled", "requeue": "requeued", "reject": "rejected"}
"""The ``manual_review.resolution`` each decision writes."""


@dataclass(frozen=True, slots=True)
class ReviewResult:
    """What a review decision did to one job.

    ``already_applied``: the same decision was applied before (by ``resolved_by`` at
    ``resolved_at``) and nothing changed now. ``label_written`` (label decisions only): whether
    ``document_labels`` holds the reviewer's label; False when a newer job's label stands.
    """

    job_id: uuid.UUID
    decision: ReviewDecision
    already_applied: bool
    status: JobStatus
    resolved_by: str | None
    resolved_at: datetime | None
    label: str | None = None
    label_written: bool | None = None


@dataclass(frozen=True, slots=True)
class ReviewCase:
    """A job waiting for a reviewer and what they need to decide: ids, references, why it is
    here, and the model's latest answer. Never the document (``payload_ref`` points to it)."""

    job_id: uuid.UUID
    correlation_id: str
    source: str
    external_id: str
    payload_ref: str
    classifier_version: str
    batch_key: str
    step: str
    attempt: int
    max_attempts: int
    replays: int
    reason: str
    error_class: str | None
    last_error: str | None
    context: Mapping[str, Any]
    opened_at: datetime
    model_label: str | None
    model_confidence: float | None
    model_outcome: str | None
    attempt_base: int = 0  # where the current attempt budget began (see jobs.schema)
