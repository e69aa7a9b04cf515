"""The ledger's exceptions: a small tree, each with its docstring as the default message.

Database errors are translated here, at the store's boundary, by constraint name: callers never
see a driver exception for a rule the ledger enforces.
"""

from __future__ import annotations

import re

import sqlalchemy as sa


class LedgerError(Exception):
    """The job ledger refused an operation."""

    def __init__(self, message: str | None = None) -> None:
        super().__init__(message or (self.__doc__ or "").strip())


class UnknownStatus(LedgerError, ValueError):
    """Not a job state."""


class JobNotFound(LedgerError, LookupError):
    """No job has this id."""


class IllegalTransition(LedgerError):
    """The state machine does not allow this move."""

    def __init__(
        self,
        message: str | None = None,
        *,
        job_id: str | None = None,
        from_status: str | None = None,
        to_status: str | None = None,
    ) -> None:
        super().__init__(message)
        self.job_id, self.from_status, self.to_status = job_id, from_status, to_status


class LeaseLost(LedgerError):
    """The job is no longer held under this lease (another attempt owns it, or it moved on)."""


class LeaseExpired(LeaseLost):
    """The lease ran out before the write; the job may already be with another worker."""


class StaleAttempt(LeaseLost):
    """The outcome belongs to an earlier attempt of the job."""


class DuplicateKey(LedgerError):
    """A job with this idempotency key exists already."""


class NotInReview(LedgerError):
    """The job is not waiting for a reviewer."""


class AuditSampleDecisionRefused(NotInReview):
    """The job is a completed audit sample: a reviewer confirms or corrects its label (a ``label``
    decision); requeue and reject do not apply to a job that is done."""


class ReplayLimitReached(LedgerError):
    """The job was requeued from review as often as allowed."""


class LabelNotInTaxonomy(LedgerError, ValueError):
    """The label is not one of the taxonomy's labels."""


class RoleRefused(LedgerError):
    """This database login may not do this: it is another role's job (docs/security.md)."""


class MoveNotPermitted(IllegalTransition, RoleRefused):
    """This database login may not make this move: another role owns it (``triage.transition_roles``)."""


class RetentionBusy(LedgerError):
    """Retention is deciding which days of the transition log to keep: a job cannot leave a
    terminal state until it is done (a minute at most); try again."""


class AppendOnly(LedgerError):
    """The transition log and the jobs are never deleted or rewritten."""


class ConstraintViolated(LedgerError):
    """A row would break one of the ledger's invariants."""


_DETAIL = re.compile(r"job_id=(?P<job>\S+) from=(?P<old>\S+) to=(?P<new>\S+)")


def translate(exc: sa.exc.DBAPIError) -> LedgerError | None:
    """The ledger error for a database error, or None when it is not one of ours."""
    diag = getattr(exc.orig, "diag", None)
    constraint = getattr(diag, "constraint_name", None) or ""
    message = getattr(diag, "message_primary", None) or str(exc.orig)
    if constraint == "job_status_transition":
        match = _DETAIL.search(getattr(diag, "message_detail", None) or "")
        if match:
            return IllegalTransition(message, job_id=match["job"], from_status=match["old"], to_status=match["new"])
        return IllegalTransition(message)
    if constraint == "job_transition_role":
        match = _DETAIL.search(getattr(diag, "message_detail", None) or "")
        if match:
            return MoveNotPermitted(message, job_id=match["job"], from_status=match["old"], to_status=match["new"])
        return MoveNotPermitted(message)
    if constraint in ("manual_review_decision_role", "document_labels_reviewer_label"):
        return RoleRefused(message)
    if constraint == "job_reopen_during_retention":
        return RetentionBusy(message)
    if constraint == "jobs_idempotency_key_key":
        return DuplicateKey(message)
    if constraint.endswith("_append_only") or constraint == "jobs_identity_immutable":
        return AppendOnly(message)
    if constraint == "manual_review_one_open_per_job":
        return ConstraintViolated(f"a job has at most one open review: {message}")
    if constraint.startswith(("jobs_", "manual_review_", "classifications_", "document_labels_")):
        return ConstraintViolated(f"{constraint}: {message}")
    if "invalid input value for enum" in message:
        return UnknownStatus(message)
    return None
