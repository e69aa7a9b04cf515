"""The params of ``reconcile_jobs``: one pydantic model, the DAG's trigger form.

Thresholds are seconds. A job is "stuck" once it has sat in a state longer than its state's
threshold; the defaults are generous so that a scheduled run never reports normal work.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field

from triage.contracts.params import DagParams, InvalidParams
from triage.jobs.vocabulary.states import JobStatus


class InvalidReconcileParams(InvalidParams):
    """The run's params do not describe a valid reconciliation."""


def _seconds(default: int, title: str, description: str, section: str = "Stuck work") -> Any:
    return Field(
        default=default,
        ge=0,
        le=30 * 86400,
        title=title,
        description=description,
        json_schema_extra={"section": section},
    )


class ReconcileParams(DagParams):
    """What one ``reconcile_jobs`` run looks for, and whether it may repair."""

    dag_id: ClassVar[str] = "reconcile_jobs"
    invalid: ClassVar[type[InvalidParams]] = InvalidReconcileParams

    dry_run: bool = Field(
        default=False,
        title="Dry run",
        description="Report what is found and what would be repaired, without changing anything.",
        json_schema_extra={"section": "Run"},
    )
    received_seconds: int = _seconds(
        900,
        "received threshold (s)",
        "A job still received after this long is moved to queued with its job.registered event (retrieval's "
        "own last step).",
    )
    queued_seconds: int = _seconds(
        6 * 3600, "queued threshold (s)", "A job queued this long without a claim is reported as stuck."
    )
    retryable_seconds: int = _seconds(
        3600,
        "retryable_failed threshold (s)",
        "A retryable job still unclaimed this long after its next_attempt_at is reported as stuck.",
    )
    waiting_seconds: int = _seconds(
        6 * 3600, "waiting threshold (s)", "A job waiting on an external system this long is reported as stuck."
    )
    running_seconds: int = _seconds(
        2 * 3600,
        "running threshold (s)",
        "A job running this long under a lease that is still valid (a heartbeat keeps it alive) is reported.",
    )
    orphan_seconds: int = _seconds(
        12 * 3600,
        "Orphaned batch threshold (s)",
        "Queued or retryable jobs of a batch in which no job has moved, heartbeated or been written for this long, "
        "and none is running or waiting, go to manual_review (orphaned): their run is gone. Keep it longer than "
        "any run's retries and than a run may wait for a pool slot (long backfills).",
    )
    last_try_seconds: int = _seconds(
        3600,
        "Dead last try threshold (s)",
        "Retryable jobs whose last holder was its task's final try go to manual_review (airflow_task_failed) once "
        "due this long in a batch with no job written, running or waiting for as long: no retry will claim them. "
        "Keep it longer than the tasks' longest retry delay (15 min) and than a cleared task's retry may wait for "
        "a pool slot.",
    )
    max_rescues: int = Field(
        default=3,
        ge=0,
        le=100,
        title="Max lease rescues",
        description="Expired leases returned per job before it goes to manual_review (lease_expired_repeatedly).",
        json_schema_extra={"section": "Leases and outbox"},
    )
    max_outage_resumes: int = Field(
        default=4,
        ge=0,
        le=100,
        title="Max outage resumes",
        description="classify_documents runs this reconciliation clears at most, each to resume a batch whose jobs "
        "parked on an outage are all due (the soonest due first; the next reconciliation takes the rest). 0: none.",
        json_schema_extra={"section": "Leases and outbox"},
    )
    outbox_age_seconds: int = _seconds(
        300,
        "Outbox age (s)",
        "Unsent outbox events older than this are republished to the event sink.",
        "Leases and outbox",
    )
    grace_seconds: int = _seconds(
        60,
        "Consistency grace (s)",
        "Consistency checks ignore jobs changed more recently than this (a writer may be mid-way).",
        "Consistency",
    )
    airflow_lookback_hours: int = Field(
        default=72,
        ge=1,
        le=24 * 90,
        title="Airflow lookback (h)",
        description="How far back Airflow's REST API is asked for failed or up_for_retry classify_documents tasks.",
        json_schema_extra={"section": "Consistency"},
    )

    report_window_hours: int = Field(
        default=168,
        ge=1,
        le=24 * 366,
        title="Report window (h)",
        description="Time in state, retry reasons and rejected outputs count the transitions of this window.",
        json_schema_extra={"section": "Report"},
    )
    review_queue_limit: int = Field(
        default=200,
        ge=1,
        le=10_000,
        title="Review queue rows",
        description="How many manual-review jobs (oldest first) the report lists.",
        json_schema_extra={"section": "Report"},
    )

    def threshold(self, status: JobStatus) -> int | None:
        """The stuck threshold of a state, or None for the settled states."""
        return {
            JobStatus.RECEIVED: self.received_seconds,
            JobStatus.QUEUED: self.queued_seconds,
            JobStatus.RETRYABLE_FAILED: self.retryable_seconds,
            JobStatus.WAITING: self.waiting_seconds,
            JobStatus.RUNNING: self.running_seconds,
        }.get(status)


def param_schemas() -> dict[str, dict[str, Any]]:
    return ReconcileParams.param_schemas()
