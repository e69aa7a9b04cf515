"""A claimed job's document from what the payload store returned: the document, or the outcome
that reading it failed with (shared by the classify step and the batch mode's submission)."""

from __future__ import annotations

from triage.contracts.documents import DocumentPayload, MalformedDocument
from triage.jobs.vocabulary.models import ClaimedJob, Fail, Outcome, RetryLater, SendToReview
from triage.payloads import PayloadError, PayloadMissing, PayloadRefInvalid, PayloadUnavailable


def read_document(job: ClaimedJob, content: bytes | PayloadError) -> DocumentPayload | Outcome:
    """The job's document, or the outcome that reading it failed with."""
    if not isinstance(content, PayloadError):  # the usual case first: one check, not five
        return _parsed(job, content)
    if isinstance(content, PayloadRefInvalid):  # a row naming what the store never wrote
        return SendToReview(job.id, job.attempt, "payload_ref_invalid", content.error_class, str(content))
    if isinstance(content, PayloadMissing):  # the store is healthy and the pack is gone: a person decides
        return SendToReview(job.id, job.attempt, "missing_payload", content.error_class, str(content))
    if isinstance(content, PayloadUnavailable):
        return RetryLater(job.id, job.attempt, content.error_class, str(content))
    return SendToReview(job.id, job.attempt, "payload_corrupt", content.error_class, str(content))


def _parsed(job: ClaimedJob, content: bytes) -> DocumentPayload | Outcome:
    try:
        return DocumentPayload.from_bytes(content)
    except MalformedDocument as exc:
        if exc.reason == "unsupported_schema_version":
            return Fail(job.id, job.attempt, "unsupported_schema_version", exc.reason, str(exc))
        return SendToReview(
            job.id, job.attempt, "malformed_input", exc.reason, str(exc), context={"malformed_reason": exc.reason}
        )
