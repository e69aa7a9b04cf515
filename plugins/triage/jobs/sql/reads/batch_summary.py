"""Read-only questions about a batch: what the summary of a run and the reports show."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa

from triage.jobs.schema import job_events, jobs, manual_review, outbox
from triage.jobs.sql.expressions import unsent_event
from triage.jobs.vocabulary.states import SETTLED, JobStatus


@dataclass(frozen=True, slots=True)
class BatchSummary:
    batch_key: str
    by_status: dict[JobStatus, int]
    review_reasons: dict[str, int]
    first_registered: datetime | None
    last_settled: datetime | None
    events_unpublished: int
    registered: int = 0  # jobs registered since the summary's ``since``

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    @property
    def seconds(self) -> float | None:
        if self.first_registered is None or self.last_settled is None:
            return None
        return (self.last_settled - self.first_registered).total_seconds()

    @property
    def documents_per_second(self) -> float | None:
        seconds = self.seconds
        return self.registered / seconds if seconds and self.registered else None


def batch_counts(conn: sa.Connection, batch_key: str) -> dict[JobStatus, int]:
    """Jobs of the batch by state, every state present (one indexed scan of the batch: cheap
    enough for ``make run``'s progress line, asked every second)."""
    query = sa.select(jobs.c.status, sa.func.count()).where(jobs.c.batch_key == batch_key).group_by(jobs.c.status)
    counts: dict[str, int] = dict(conn.execute(query).tuples().all())
    return {s: counts.get(s.value, 0) for s in JobStatus}


def batch_summary(conn: sa.Connection, batch_key: str, since: datetime | None = None) -> BatchSummary:
    """Jobs of the batch by state and open reviews by reason; the throughput counts only the
    transitions at or after ``since`` (one run's work, not the batch's whole history)."""
    in_batch = sa.select(jobs.c.id).where(jobs.c.batch_key == batch_key)
    reasons: dict[str, int] = dict(
        conn.execute(
            sa.select(manual_review.c.reason, sa.func.count())
            .join(jobs, jobs.c.id == manual_review.c.job_id)
            .where(jobs.c.batch_key == batch_key, manual_review.c.resolved_at.is_(None))
            .group_by(manual_review.c.reason)
            .order_by(sa.func.count().desc())
        )
        .tuples()
        .all()
    )
    settled = sorted(s.value for s in SETTLED)
    first, last, registered_now = conn.execute(
        sa.select(
            sa.func.min(job_events.c.at).filter(job_events.c.from_status.is_(None)),
            sa.func.max(job_events.c.at).filter(job_events.c.to_status.in_(settled)),
            sa.func.count().filter(job_events.c.from_status.is_(None)),
        ).where(job_events.c.job_id.in_(in_batch), job_events.c.at >= (since or datetime.min.replace(tzinfo=UTC)))
    ).one()
    unpublished = conn.execute(
        sa.select(sa.func.count()).where(outbox.c.job_id.in_(in_batch), unsent_event())
    ).scalar_one()
    return BatchSummary(
        batch_key=batch_key,
        by_status=batch_counts(conn, batch_key),
        review_reasons={str(k): int(v) for k, v in reasons.items()},
        first_registered=first,
        last_settled=last,
        events_unpublished=int(unpublished),
        registered=int(registered_now),
    )


def format_summary(summary: BatchSummary) -> str:
    lines = [f"batch {summary.batch_key}: {summary.total} jobs"]
    lines += [f"  {status.value:<18}{n:>8}" for status, n in summary.by_status.items() if n]
    if summary.review_reasons:
        lines.append("  open reviews by reason:")
        lines += [f"    {reason:<26}{n:>8}" for reason, n in summary.review_reasons.items()]
    lines.append(f"  registered by this run: {summary.registered}")
    if summary.documents_per_second is not None:
        lines.append(
            f"  {summary.documents_per_second:,.0f} documents/s from its first registration to its last"
            f" settled job ({summary.seconds:.1f} s)"
        )
    lines.append(f"  outbox events not yet published: {summary.events_unpublished}")
    return "\n".join(lines)
