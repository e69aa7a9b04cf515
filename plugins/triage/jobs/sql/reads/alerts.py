"""Read-only questions the alerts ask of the ledger: what one DAG run sent to review or failed.

A run's moves are the transitions logged under its actors: every lease owner, and the failure
callback, of a ``classify_documents`` run starts with ``dag/run/``
(:func:`triage.adapters.task_context.run_prefix`), so ``job_events.actor`` tells this run's moves from
another run's of the same date, and from reconciliation's or a reviewer's.

``job_events`` is partitioned by day of ``at``: a run's moves lie between the moment its run
could begin (``since``) and the statement's start, so the read probes only those days'
partitions. Unbounded, each of the batch's jobs was probed in every partition (the days kept
and the days made ahead): 0.1 s for the first 100,000-document day on a ledger, 1.3-1.5 s from
the second on (``tests/ledger/test_plans.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg

from triage.jobs.schema import job_events, jobs
from triage.jobs.vocabulary.states import JobStatus

SAMPLE = 25
"""Job ids kept per state: enough to start looking, bounded so an alert stays small."""

ALERTED_STATES = (JobStatus.MANUAL_REVIEW, JobStatus.TERMINAL_FAILED)


@dataclass(frozen=True, slots=True)
class Entered:
    """Jobs one run moved into one state: how many (each job once), by reason, and a sample."""

    jobs: int = 0
    reasons: Mapping[str, int] = field(default_factory=dict)
    job_ids: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class RunMoves:
    """What a run moved into the states that need a person, against the size of its batch."""

    batch_key: str
    batch_jobs: int
    entered: Mapping[JobStatus, Entered]

    def of(self, status: JobStatus) -> Entered:
        return self.entered.get(status, Entered())


def _entries_of_run(*columns: Any) -> Any:
    """``columns`` over the transitions into review or terminal failure that the run's actors
    logged for jobs of the batch: ``jobs_batch_key_status_idx`` finds the batch's jobs,
    ``job_events_job_id_id_idx`` their events in the partitions from ``since`` (no bound when
    None) to the statement's start (a stable bound: pruned as the statement starts);
    ``starts_with`` takes the run id literally."""
    since = sa.func.coalesce(
        sa.bindparam("since", type_=sa.DateTime(timezone=True)),
        sa.cast(sa.literal("-infinity"), sa.DateTime(timezone=True)),
    )
    return (
        sa.select(job_events.c.to_status, *columns)
        .join(jobs, jobs.c.id == job_events.c.job_id)
        .where(
            jobs.c.batch_key == sa.bindparam("batch_key"),
            job_events.c.to_status.in_([s.value for s in ALERTED_STATES]),
            sa.func.starts_with(job_events.c.actor, sa.bindparam("run_prefix", type_=sa.Text)),
            job_events.c.at >= since,
            job_events.c.at <= sa.func.statement_timestamp(),
        )
        .group_by(job_events.c.to_status)
    )


@cache
def _entered_by_reason() -> Any:
    n = sa.func.count(sa.distinct(job_events.c.job_id)).label("n")
    return _entries_of_run(job_events.c.reason, n).group_by(job_events.c.reason)


@cache
def _entered_jobs() -> Any:
    """Each job once per target state (a job may enter review twice in one run, after a requeue)."""
    return _entries_of_run(
        sa.func.count(sa.distinct(job_events.c.job_id)).label("n"),
        pg.array_agg(sa.distinct(job_events.c.job_id))[1:SAMPLE].label("job_ids"),
    )


@cache
def _batch_size() -> Any:
    return sa.select(sa.func.count()).where(jobs.c.batch_key == sa.bindparam("batch_key"))


def run_moves(conn: sa.Connection, *, batch_key: str, run_prefix: str, since: datetime | None = None) -> RunMoves:
    """Jobs of ``batch_key`` that the run whose actors start with ``run_prefix`` moved into
    ``manual_review`` or ``terminal_failed`` (whatever their state is now), and the batch's size.
    ``since``: no move of the run was logged before it (:func:`triage.adapters.task_context.run_began_after`)."""
    params = {"batch_key": batch_key, "run_prefix": run_prefix, "since": since}
    reasons: dict[JobStatus, dict[str, int]] = {}
    for row in conn.execute(_entered_by_reason(), params):
        reasons.setdefault(JobStatus(row.to_status), {})[row.reason or "unknown"] = int(row.n)
    entered = {
        JobStatus(row.to_status): Entered(
            jobs=int(row.n),
            reasons=dict(sorted(reasons.get(JobStatus(row.to_status), {}).items(), key=lambda kv: (-kv[1], kv[0]))),
            job_ids=tuple(str(i) for i in row.job_ids),
        )
        for row in conn.execute(_entered_jobs(), params)
    }
    total = int(conn.execute(_batch_size(), params).scalar_one())
    return RunMoves(batch_key=batch_key, batch_jobs=total, entered=entered)
