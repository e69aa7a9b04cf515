"""Apply one reviewer's decision to many jobs, each on its own, and report every outcome.

Each job is its own transaction (:class:`~triage.jobs.store.JobStore`'s review decisions): a
refused job (unknown, not in review, replays spent, label outside the taxonomy) changes nothing
and never blocks the others. The caller decides what a refusal means for the run; the Airflow
operator applies the valid ones, then fails the task listing every refusal.

A reviewer's label then goes to the label action, the same one the model's labels go through
(:mod:`triage.ports.label_actions`), after its decision committed and outside any transaction:
under the job's key with its review (the same decision applied again asks for the same effect,
so a retry is safe), with the job's order, and not at all when a newer job's label is the
document's. A decision that stands but whose label the provider did not confirm is reported
(``action``: ``failed: …``); applying the same decision again sends it again.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

from triage import markdown as md
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.errors import LedgerError
from triage.jobs.vocabulary.models import ReviewResult
from triage.ports.label_actions import ActionFailed, LabelRequest
from triage.review.config import ReviewRunConfig

JobOutcome = Literal["applied", "already_applied", "refused"]
SendLabel = Callable[[LabelRequest], None]
"""The label action's ``send`` (:meth:`triage.ports.label_actions.LabelAction.send`):
raises :class:`~triage.ports.label_actions.ActionFailed` when the provider did not confirm."""


@dataclass(frozen=True, slots=True)
class JobReport:
    """What happened to one job. ``detail`` names the refusal, or who decided and when."""

    job_id: str
    outcome: JobOutcome
    status: str | None
    detail: str
    action: str | None = None
    """The reviewer's label at the provider: ``sent``, ``skipped: …`` or ``failed: …``; None
    when there is nothing to send (not a label, refused, or no label action configured)."""


@dataclass(frozen=True, slots=True)
class ReviewReport:
    decision: str
    label: str | None
    reviewer: str
    jobs: tuple[JobReport, ...]

    def count(self, outcome: JobOutcome) -> int:
        return sum(1 for j in self.jobs if j.outcome == outcome)

    @property
    def refused(self) -> tuple[JobReport, ...]:
        return tuple(j for j in self.jobs if j.outcome == "refused")

    @property
    def unsent(self) -> tuple[JobReport, ...]:
        """Decided, but the provider did not confirm the reviewer's label."""
        return tuple(j for j in self.jobs if (j.action or "").startswith("failed"))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (XCom): counts first, then every job."""
        counts = {o: self.count(o) for o in ("applied", "already_applied", "refused")}
        return {
            "decision": self.decision,
            "label": self.label,
            "reviewer": self.reviewer,
            **counts,
            "labels_unsent": len(self.unsent),
            "jobs": [asdict(j) for j in self.jobs],
        }

    def to_markdown(self) -> str:
        """A table for the task log: ids, outcomes and reasons only (never document text).

        The job ids are what the run was given (a refused one may be any text), the label and
        the reviewer's name come from the form and Airflow: all escaped (:mod:`triage.markdown`).
        """
        what = md.text(self.decision) + (f" {md.code(self.label)}" if self.label else "")
        lines = [
            f"### review_jobs: {what} by {md.text(self.reviewer)}",
            f"applied {self.count('applied')} · already applied {self.count('already_applied')} · "
            f"refused {self.count('refused')}",
            "",
            *md.table(
                ["job", "outcome", "status", "detail", "label action"],
                [(j.job_id, j.outcome, j.status or "-", j.detail, j.action or "-") for j in self.jobs],
                code_columns=frozenset({0}),
            ),
        ]
        return "\n".join(lines)


def apply_review(
    store: JobStore,
    job_ids: Sequence[str],
    config: ReviewRunConfig,
    *,
    reviewer: str,
    taxonomy_names: Collection[str],
    send_label: SendLabel | None = None,
) -> ReviewReport:
    """Apply ``config``'s decision to each job (duplicates once, in the given order); with
    ``send_label``, send each reviewer's label that stands to the provider."""
    reports = [_one(store, raw, config, reviewer, taxonomy_names, send_label) for raw in dict.fromkeys(job_ids)]
    return ReviewReport(config.decision, config.label, reviewer, tuple(reports))


def _one(
    store: JobStore,
    raw: str,
    config: ReviewRunConfig,
    reviewer: str,
    taxonomy_names: Collection[str],
    send_label: SendLabel | None,
) -> JobReport:
    try:
        job_id = uuid.UUID(str(raw).strip())
    except ValueError:
        return JobReport(str(raw), "refused", None, "NotAJobId: not a UUID")
    try:
        result = decide(store, job_id, config, reviewer=reviewer, taxonomy_names=taxonomy_names)
    except LedgerError as exc:  # the ledger's refusals: the transaction rolled back whole
        return JobReport(str(job_id), "refused", None, f"{type(exc).__name__}: {exc}")
    report = _reported(result)
    if config.decision == "label" and send_label is not None:
        report = replace(report, action=send_reviewed_label(store, job_id, send_label))
    return report


def send_reviewed_label(store: JobStore, job_id: uuid.UUID, send_label: SendLabel) -> str:
    """Send the label a reviewer completed ``job_id`` with (the decision has committed: this
    runs outside any transaction); returns what happened, for the report."""
    reviewed = store.review.reviewed_label(job_id)
    if reviewed is None:  # only after a label decision that stands; a concurrent change otherwise
        return "skipped: the job is not completed with a reviewer's label"
    if reviewed.superseded:
        return "skipped: a newer job's label stands for this document"
    if reviewed.resolution == "confirmed":  # the model's label, which the provider has already
        return "skipped: the reviewer confirmed the label already sent"
    request = LabelRequest(
        reviewed.idempotency_key,
        reviewed.job_id,
        reviewed.job_created_at,
        reviewed.source,
        reviewed.external_id,
        reviewed.correlation_id,
        reviewed.label,
        None,
        f"human:{reviewed.reviewer}",
        reviewed.revision,
    )
    try:
        send_label(request)
    except ActionFailed as exc:  # reported per job; the operator fails the task for its retry
        return f"failed: {type(exc).__name__}: {exc}"
    return "sent"


def decide(
    store: JobStore, job_id: uuid.UUID, config: ReviewRunConfig, *, reviewer: str, taxonomy_names: Collection[str]
) -> ReviewResult:
    """One job, one transaction: the store method of ``config.decision``."""
    if config.decision == "label":
        assert config.label is not None  # the config refuses a label decision without one
        return store.review.resolve_with_label(
            job_id, config.label, actor=reviewer, note=config.note, taxonomy_names=taxonomy_names
        )
    if config.decision == "reject":
        return store.review.reject(job_id, actor=reviewer, note=config.note)
    return store.review.resolve_with_requeue(job_id, actor=reviewer, note=config.note, max_replays=config.max_replays)


def _reported(result: ReviewResult) -> JobReport:
    when = f"{result.resolved_at:%Y-%m-%d %H:%M:%S %Z}" if result.resolved_at else "?"
    if result.already_applied:
        detail = f"the same decision stands since {when} (by {result.resolved_by}); nothing changed"
        return JobReport(str(result.job_id), "already_applied", result.status.value, detail)
    detail = f"resolved by {result.resolved_by} at {when}"
    if result.label_written is False:
        detail += "; a newer job's label for this document stands"
    return JobReport(str(result.job_id), "applied", result.status.value, detail)
