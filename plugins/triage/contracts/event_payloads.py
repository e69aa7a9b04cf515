"""What each event type carries in its ``payload``: the keys consumers may rely on.

Payloads are open objects (``extra="allow"``): a later release may add a key within the same
schema version, and a consumer ignores keys it does not know (:mod:`triage.contracts.events`,
the compatibility rule). They never hold document text, an error's text (it may echo input)
or a credential: codes, labels and who decided.

The relay does not validate payloads on the hot path (an event is built from its outbox row);
the tests validate what every statement writes against these models' schemas.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class _Payload(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class RegisteredPayload(_Payload):
    """``job.registered``: the job exists and is queued (or, malformed on arrival, in review:
    a ``job.needs_review`` follows). No keys yet: the envelope says it all."""


class CompletedPayload(_Payload):
    """``job.completed``: the job's output is persisted. A classifier's completion carries the
    label written to ``document_labels``; a reviewer's label adds the decision. A reviewer's
    correction of an audited label is another ``job.completed`` of the same job (the newest wins:
    a consumer keeps the latest event's label). A completion
    that wrote no label (none in this release) carries no keys."""

    label: str | None = Field(default=None, description="The label written for the document.")
    confidence: float | None = Field(
        default=None, ge=0, le=1, description="The classifier's confidence; null for a reviewer's label."
    )
    classifier_version: str | None = Field(
        default=None, description="Who labelled: the classifier's version, or human:<reviewer>."
    )
    resolution: Literal["labelled", "corrected"] | None = Field(
        default=None,
        description="Present when a reviewer labelled it (labelled), or corrected the label of an audit sample of "
        "the completed job (corrected: the label replaces the one published before).",
    )
    resolved_by: str | None = Field(default=None, description="The reviewer (their Airflow identity).")
    previous_label: str | None = Field(
        default=None, description="For a correction: the label the reviewer replaced (the model's)."
    )


class RequeuedPayload(_Payload):
    """``job.requeued``: queued again as fresh work, by a reviewer or a replay by filter."""

    resolution: Literal["requeued"] | None = None
    resolved_by: str | None = Field(default=None, description="The reviewer, or who requested the replay.")
    reason: str | None = Field(default=None, description="For a replay by filter: replayed:<replay key>.")


class ReviewedPayload(_Payload):
    """``job.reviewed``: a reviewer's decision that is not a label (today: reject; the job's
    move into ``terminal_failed`` is its ``job.failed`` event)."""

    resolution: Literal["rejected"]
    resolved_by: str = Field(description="The reviewer (their Airflow identity).")


class NeedsReviewPayload(_Payload):
    """``job.needs_review``: the job entered ``manual_review`` and a review case is open."""

    reason: str = Field(description="Why, a code: inconclusive, retries_exhausted, malformed_input, orphaned, …")
    error_class: str | None = Field(default=None, description="The error class of the last failure, if any.")


class FailedPayload(_Payload):
    """``job.failed``: the job entered ``terminal_failed``; no automatic attempt follows."""

    reason: str = Field(description="Why, a code: a permanent error's reason, or rejected by a reviewer.")
    error_class: str | None = Field(default=None, description="The error class, if a failure caused it.")
    resolved_by: str | None = Field(default=None, description="The reviewer, for a rejection.")


PAYLOADS: dict[str, type[_Payload]] = {
    "job.registered": RegisteredPayload,
    "job.completed": CompletedPayload,
    "job.requeued": RequeuedPayload,
    "job.reviewed": ReviewedPayload,
    "job.needs_review": NeedsReviewPayload,
    "job.failed": FailedPayload,
}
"""Every event type's payload model (a test keeps the keys equal to the event types)."""
