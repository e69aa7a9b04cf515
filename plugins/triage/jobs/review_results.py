"""What a review decision returns once its fenced write ran: applied, the same decision
already standing (``already_applied``), or a named refusal. Only reads; they never commit
(:class:`~triage.jobs.decisions.ReviewDecisions` owns the decision's transaction).
"""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from triage.jobs import queries
from triage.jobs.audit_samples import AUDIT_REASON, AUDIT_RESOLUTIONS
from triage.jobs.errors import AuditSampleDecisionRefused, JobNotFound, NotInReview, ReplayLimitReached
from triage.jobs.models import REVIEW_RESOLUTIONS, ReviewDecision, ReviewResult
from triage.jobs.states import JobStatus, parse_status

AUDIT_LABEL_RESOLUTIONS = {REVIEW_RESOLUTIONS["label"], *AUDIT_RESOLUTIONS}
"""What a ``label`` decision leaves on a review row: ``labelled``, or on an audit sample
``confirmed`` or ``corrected``; the same label again is the same decision."""

_DECISION_ENDS = {"label": JobStatus.COMPLETED, "reject": JobStatus.TERMINAL_FAILED}


def applied(
    conn: sa.Connection,
    job_id: uuid.UUID,
    decision: ReviewDecision,
    *,
    label: str | None = None,
    label_written: bool | None = None,
) -> ReviewResult:
    row = conn.execute(queries.review_state(), {"p_job_id": job_id}).one()
    return ReviewResult(
        job_id,
        decision,
        already_applied=False,
        status=parse_status(row.status),
        resolved_by=row.resolved_by,
        resolved_at=row.resolved_at,
        label=label,
        label_written=label_written,
    )


def missed(
    conn: sa.Connection,
    job_id: uuid.UUID,
    decision: ReviewDecision,
    *,
    label: str | None = None,
    max_replays: int | None = None,
) -> ReviewResult:
    """Why a decision's fenced write matched nothing: the same decision stands already (returned
    as ``already_applied``), or a named refusal. Only reads; the transaction wrote nothing."""
    row = conn.execute(queries.review_state(), {"p_job_id": job_id}).first()
    if row is None:
        raise JobNotFound(f"job {job_id} does not exist")
    status = parse_status(row.status)
    if status == JobStatus.MANUAL_REVIEW:
        if decision == "requeue" and max_replays is not None and row.replays >= max_replays:
            raise ReplayLimitReached(f"job {job_id} was requeued {row.replays} times (limit {max_replays})")
        raise NotInReview(f"job {job_id} changed while the decision was applied; apply it again")  # a lost race
    if row.resolution is None and row.reason == AUDIT_REASON and decision != "label":
        raise AuditSampleDecisionRefused(
            f"job {job_id} is completed and its open review is an audit sample: confirm or correct its label "
            f"(action label); {decision} applies only to jobs in manual_review"
        )
    resolutions = AUDIT_LABEL_RESOLUTIONS if decision == "label" else {REVIEW_RESOLUTIONS[decision]}
    same = (
        row.resolution in resolutions
        and _DECISION_ENDS.get(decision, status) == status
        and (decision != "label" or row.resolved_label == label)
    )
    if same:
        return ReviewResult(
            job_id,
            decision,
            already_applied=True,
            status=status,
            resolved_by=row.resolved_by,
            resolved_at=row.resolved_at,
            label=label,
        )
    if row.resolution is None:
        raise NotInReview(f"job {job_id} is {status.value}, not in manual_review")
    earlier = f"{row.resolution}" + (f" as {row.resolved_label!r}" if row.resolved_label else "")
    raise NotInReview(
        f"job {job_id} is {status.value}, not in manual_review: its review was already resolved "
        f"({earlier} by {row.resolved_by} at {row.resolved_at:%Y-%m-%d %H:%M:%S %Z})"
    )
