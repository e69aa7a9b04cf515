"""The ledger's consistency checks, as named read-only SQLAlchemy Core statements, and the
conditions they count.

Each check answers one question of :mod:`triage.reconciliation.rules` with a count, the age of
the oldest case and a bounded sample of job ids, so a check costs one round trip whatever the
number of jobs it finds. Thresholds arrive as seconds (``:threshold``, ``:grace``) and are
compared with the database's ``now()``. A repair of :mod:`.repairs` matches exactly what its
check counts: both are built from the conditions here, which nothing restates.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement, Grouping

from triage.jobs.audit_samples import is_open_audit_sample
from triage.jobs.expressions import NOW, status_literal
from triage.jobs.expressions import seconds_param as seconds
from triage.jobs.outages import parked
from triage.jobs.schema import document_labels, job_events, jobs, manual_review, outbox
from triage.jobs.states import CLAIMABLE, TERMINAL, UNFINISHED, EventType, Step
from triage.jobs.states import JobStatus as S

SAMPLE = 25
"""Job ids kept per check: enough to act on, bounded so a reconciliation run's row stays small."""
UUIDS = pg.ARRAY(pg.UUID(as_uuid=True))
COMPLETION_EVENTS = (EventType.COMPLETED.value,)
"""What tells consumers a completed job is done, a reviewer's label included (its payload names
the label and the reviewer); ``job.reviewed`` is a rejection's, whose job ends terminal_failed."""


CONSISTENCY_WINDOW = sa.literal_column("interval '1 day'", sa.Interval)
"""How far back the consistency checks of finished work look (completions, labels): every
15-minute run reads only the last day's, never the history, and the outbox's retention (whose
floor is two days: triage.settings.Retention) never removes an event these checks still want."""


def recent(at: ColumnElement[Any]) -> ColumnElement[bool]:
    """Written within :data:`CONSISTENCY_WINDOW` (served by ``jobs_terminal_recent_idx`` and
    ``document_labels_updated_at_idx``)."""
    return at >= NOW - CONSISTENCY_WINDOW


def age_seconds(at: ColumnElement[Any]) -> ColumnElement[Any]:
    return sa.func.extract("epoch", NOW - at)


def entered_at() -> ColumnElement[Any]:
    """When the job entered its current state: its latest transition into it (``job_events``).
    Only the log's days since the job was created are read (run-time partition pruning: the
    log is partitioned by day of ``at``)."""
    return (
        sa.select(sa.func.max(job_events.c.at))
        .where(
            job_events.c.job_id == jobs.c.id,
            job_events.c.to_status == jobs.c.status,
            job_events.c.at >= jobs.c.created_at,
        )
        .scalar_subquery()
    )


def _summary(ids: ColumnElement[Any], since: ColumnElement[Any]) -> list[ColumnElement[Any]]:
    """count, age of the oldest case (s), the ids of the oldest :data:`SAMPLE` cases."""
    return [
        sa.func.count().label("n"),
        sa.func.coalesce(sa.func.max(age_seconds(since)), 0).label("oldest_seconds"),
        sa.func.coalesce(
            # pg.aggregate_order_by, not 2.1's FunctionElement.aggregate_order_by: the image runs
            # SQLAlchemy 2.0 (Airflow's constraints).
            sa.type_coerce(Grouping(sa.func.array_agg(pg.aggregate_order_by(ids, since))), UUIDS)[1:SAMPLE],
            sa.cast(pg.array([]), UUIDS),
        ).label("job_ids"),
    ]


def summarise(rows: Any) -> sa.Select[Any]:
    """The count, oldest age and sample of a subquery with columns ``id`` and ``since``."""
    return sa.select(*_summary(rows.c.id, rows.c.since))


@cache
def expired_leases() -> sa.Select[Any]:
    """Running jobs whose lease has passed (what ``release_expired_leases`` would take)."""
    rows = (
        sa.select(jobs.c.id, jobs.c.lease_expires_at.label("since"))
        .where(jobs.c.status == S.RUNNING.value, jobs.c.lease_expires_at < NOW)
        .subquery()
    )
    return summarise(rows)


@cache
def stuck_in(status: S) -> sa.Select[Any]:
    """Jobs in ``status`` longer than ``:threshold`` seconds.

    ``retryable_failed`` counts from ``next_attempt_at`` (it is not due before); ``running``
    only under a lease that is still valid (expired leases are the lease rule's). The cheap
    ``updated_at`` test comes first: a job cannot have entered its state after its last update.
    """
    if status == S.RETRYABLE_FAILED:
        since: ColumnElement[Any] = jobs.c.next_attempt_at
        where = [jobs.c.next_attempt_at < NOW - seconds("threshold")]
    else:
        since = entered_at()
        where = [jobs.c.updated_at < NOW - seconds("threshold") if status != S.RUNNING else sa.true()]
        if status == S.RUNNING:
            where.append(jobs.c.lease_expires_at >= NOW)
    rows = sa.select(jobs.c.id, since.label("since")).where(jobs.c.status == status.value, *where).subquery()
    return sa.select(*_summary(rows.c.id, rows.c.since)).where(rows.c.since < NOW - seconds("threshold"))


# -- conditions a check counts and its repair fixes (repairs.py restates none of them) ----------


def settled() -> ColumnElement[bool]:
    """Not changed for ``:grace`` seconds: no writer is mid-way through this job."""
    return jobs.c.updated_at < NOW - seconds("grace")


def in_state(*states: S) -> ColumnElement[bool]:
    """The job is in one of ``states`` (a group of :mod:`triage.jobs.states`, or one state), as
    typed constants: the planner matches partial indexes."""
    if len(states) == 1:
        return jobs.c.status == status_literal(states[0])
    return jobs.c.status.in_([status_literal(s) for s in sorted(states)])


def has_open_review() -> ColumnElement[bool]:
    return sa.exists().where(manual_review.c.job_id == jobs.c.id, manual_review.c.resolved_at.is_(None))


def has_completion_event() -> ColumnElement[bool]:
    return sa.exists().where(outbox.c.job_id == jobs.c.id, outbox.c.event_type.in_(COMPLETION_EVENTS))


def spent_retryable() -> list[ColumnElement[bool]]:
    """Retryable jobs whose attempts are spent: no claim will ever take them (a claim needs
    ``attempt < max_attempts``), so they would sit in ``retryable_failed`` forever."""
    return [in_state(S.RETRYABLE_FAILED), jobs.c.attempt >= jobs.c.max_attempts, settled()]


def in_review_without_row() -> list[ColumnElement[bool]]:
    """Jobs in ``manual_review`` with no open review row: a reviewer would never see them."""
    return [in_state(S.MANUAL_REVIEW), settled(), ~has_open_review()]


def completed_without_completion_event() -> list[ColumnElement[bool]]:
    """Completed jobs of the last day (:data:`CONSISTENCY_WINDOW`) without a ``job.completed``
    event in the outbox."""
    return [in_state(S.COMPLETED), settled(), recent(jobs.c.updated_at), ~has_completion_event()]


def open_review_of_job_in(*states: S) -> list[ColumnElement[bool]]:
    """Open review rows (joined to their job) whose job is in ``states``; an audit sample of a
    completed job is no such case (its job stays completed by design: :mod:`.audit_samples`)."""
    return [
        manual_review.c.resolved_at.is_(None),
        manual_review.c.job_id == jobs.c.id,
        in_state(*states),
        settled(),
        ~is_open_audit_sample(),
    ]


def orphaned() -> list[ColumnElement[bool]]:
    """Claimable jobs (``queued``, ``retryable_failed``) left behind by a run that is gone: the
    job has been idle for ``:threshold`` seconds (counted from ``next_attempt_at`` if that is
    later: a backoff is not idleness), and no job of its batch has moved, heartbeated or been
    written for as long, none is ``running`` (a lease, live or about to be released) and none is
    ``waiting`` (parked on a dependency; the run that parked it will come back for it).

    Without Airflow's API this is the only sign that a batch's runs are over: a live run claims,
    heartbeats and completes, and each of those sets ``updated_at`` on some job of its batch.
    """
    idle_since = sa.func.greatest(jobs.c.updated_at, jobs.c.next_attempt_at)
    return [in_state(*CLAIMABLE), idle_since < NOW - seconds("threshold"), batch_idle()]


def batch_idle() -> ColumnElement[bool]:
    """No job of the job's batch has been written for ``:threshold`` seconds (no claim,
    heartbeat, outcome or release), none is ``running`` (a lease, live or about to be released)
    and none is ``waiting`` (parked: the run that parked it comes back for it)."""
    batch = jobs.alias("batch")
    return ~sa.exists().where(
        batch.c.batch_key == jobs.c.batch_key,
        sa.or_(
            batch.c.updated_at >= NOW - seconds("threshold"),
            batch.c.status.in_([status_literal(S.RUNNING), status_literal(S.WAITING)]),
        ),
    )


@cache
def orphaned_work() -> sa.Select[Any]:
    """Claimable jobs of batches nobody has worked on for ``:threshold`` seconds (:func:`orphaned`)."""
    rows = sa.select(jobs.c.id, jobs.c.updated_at.label("since")).where(*orphaned()).subquery()
    return summarise(rows)


@cache
def unclaimable_retryable() -> sa.Select[Any]:
    """Retryable jobs whose attempts are spent (:func:`spent_retryable`)."""
    rows = sa.select(jobs.c.id, jobs.c.next_attempt_at.label("since")).where(*spent_retryable()).subquery()
    return summarise(rows)


@cache
def unclaimable_version() -> sa.Select[Any]:
    """Jobs waiting for a classify claim whose classifier version is none of ``:versions`` (the
    versions the deployment's classifiers have now): a claim takes only the jobs of its own
    classifier's version, so no run of this deployment will ever take them."""
    rows = (
        sa.select(jobs.c.id, jobs.c.updated_at.label("since"))
        .where(
            in_state(*CLAIMABLE),
            jobs.c.step == Step.CLASSIFY.value,
            settled(),
            jobs.c.classifier_version != sa.all_(sa.bindparam("versions", type_=pg.ARRAY(sa.Text))),
        )
        .subquery()
    )
    return summarise(rows)


@cache
def outbox_lag() -> sa.Select[Any]:
    """Unsent events: how many, the oldest one's age, and how many are older than ``:threshold``."""
    unsent = outbox.c.published_at.is_(None)
    return sa.select(
        sa.func.count().label("unsent"),
        sa.func.coalesce(sa.func.max(age_seconds(outbox.c.created_at)), 0).label("oldest_seconds"),
        sa.func.count().filter(outbox.c.created_at < NOW - seconds("threshold")).label("old"),
    ).where(unsent)


@cache
def completed_without_label() -> sa.Select[Any]:
    """Completed jobs of the last day whose document has no label from this job or a newer one."""
    # OFFSET 0 keeps the EXISTS a per-job probe of the labels' key: pulled up into an anti-join,
    # the planner hashed every label ever written (a scan of the history every 15 minutes).
    newer_or_own = (
        sa.select(sa.literal(1))
        .where(
            document_labels.c.source == jobs.c.source,
            document_labels.c.external_id == jobs.c.external_id,
            sa.tuple_(document_labels.c.job_created_at, document_labels.c.job_id)
            >= sa.tuple_(jobs.c.created_at, jobs.c.id),
        )
        .offset(0)
        .exists()
    )
    rows = (
        sa.select(jobs.c.id, jobs.c.updated_at.label("since"))
        .where(in_state(S.COMPLETED), settled(), recent(jobs.c.updated_at), ~newer_or_own)
        .subquery()
    )
    return summarise(rows)


@cache
def label_without_completed_job() -> sa.Select[Any]:
    """Labels of the last day whose writing job does not exist or is not completed."""
    # OFFSET 0, as in completed_without_label: a probe of jobs_pkey per label. Pulled up into an
    # anti-join, once a day's labels outnumber a few thousand the planner hashed every completed
    # job ever (a parallel scan of the whole jobs table: 1.2 s at 1M jobs, every 15 minutes).
    completed = (
        sa.select(sa.literal(1))
        .where(jobs.c.id == document_labels.c.job_id, jobs.c.status == S.COMPLETED.value)
        .offset(0)
        .exists()
    )
    rows = (
        sa.select(document_labels.c.job_id.label("id"), document_labels.c.updated_at.label("since"))
        .where(~completed, document_labels.c.updated_at < NOW - seconds("grace"), recent(document_labels.c.updated_at))
        .subquery()
    )
    return summarise(rows)


@cache
def review_row_missing() -> sa.Select[Any]:
    """Jobs in ``manual_review`` with no open review row (:func:`in_review_without_row`)."""
    rows = sa.select(jobs.c.id, jobs.c.updated_at.label("since")).where(*in_review_without_row()).subquery()
    return summarise(rows)


@cache
def stale_open_reviews(terminal: bool) -> sa.Select[Any]:
    """Open review rows whose job has left ``manual_review``: into a terminal state
    (``terminal=True``) or back into automatic hands (``terminal=False``)."""
    states = TERMINAL if terminal else UNFINISHED
    rows = (
        sa.select(jobs.c.id, manual_review.c.created_at.label("since"))
        .select_from(manual_review, jobs)
        .where(*open_review_of_job_in(*states))
        .subquery()
    )
    return summarise(rows)


@cache
def completed_without_event() -> sa.Select[Any]:
    """Completed jobs without a completion event (:func:`completed_without_completion_event`)."""
    rows = (
        sa.select(jobs.c.id, jobs.c.updated_at.label("since")).where(*completed_without_completion_event()).subquery()
    )
    return summarise(rows)


UNFINISHED_VALUES = sorted(s.value for s in UNFINISHED)


@cache
def unfinished_by_batch() -> sa.Select[Any]:
    """Unfinished jobs of each given batch (``:batch_keys``), with a sample of their ids."""
    return (
        sa.select(jobs.c.batch_key, *_summary(jobs.c.id, jobs.c.updated_at))
        .where(
            jobs.c.batch_key == sa.any_(sa.bindparam("batch_keys", type_=pg.ARRAY(sa.Text))),
            jobs.c.status.in_(UNFINISHED_VALUES),
        )
        .group_by(jobs.c.batch_key)
    )


# -- work parked on an outage (reconciliation resumes it: triage.reconciliation.outage_resumes) --


@cache
def parked_outages() -> sa.Select[Any]:
    """Batches with jobs parked on an outage (:func:`triage.jobs.outages.parked`), the soonest
    due first: how many, when the last of them is due and in how many seconds (``<= 0``: all
    are due), how many jobs of the batch run under a live lease, and a sample of the parked ids."""
    batch = jobs.alias("batch")
    live_leases = (
        sa.select(sa.func.count())
        .where(
            batch.c.batch_key == jobs.c.batch_key,
            batch.c.status == status_literal(S.RUNNING),
            batch.c.lease_expires_at >= NOW,
        )
        .scalar_subquery()
    )
    due_at = sa.func.max(jobs.c.next_attempt_at)
    return (
        sa.select(
            jobs.c.batch_key,
            due_at.label("due_at"),
            sa.func.extract("epoch", due_at - NOW).label("due_in_seconds"),
            live_leases.label("live_leases"),
            *_summary(jobs.c.id, jobs.c.next_attempt_at),
        )
        .where(parked())
        .group_by(jobs.c.batch_key)
        .order_by(due_at, jobs.c.batch_key)
    )


@cache
def unfinished_movers() -> sa.Select[Any]:
    """Who made the latest move of the unfinished jobs of each batch of ``:batch_keys``: per
    batch and actor, how many jobs, and the id of the newest such move of a parked job (NULL:
    the actor parked none). A Triage task's actor is its lease owner (``dag/run/task/map/tryN``),
    so these name the runs that hold a batch's unfinished work and the run that parked it last."""
    last = (
        sa.select(job_events.c.id, job_events.c.actor)
        .where(job_events.c.job_id == jobs.c.id)
        .order_by(job_events.c.id.desc())
        .limit(1)
        .lateral("last_move")
    )
    return (
        sa.select(
            jobs.c.batch_key,
            last.c.actor,
            sa.func.count().label("n"),
            sa.func.max(last.c.id).filter(parked()).label("parked_at_event"),
        )
        .select_from(jobs.join(last, sa.true()))
        .where(
            jobs.c.batch_key == sa.any_(sa.bindparam("batch_keys", type_=pg.ARRAY(sa.Text))),
            jobs.c.status.in_(UNFINISHED_VALUES),
        )
        .group_by(jobs.c.batch_key, last.c.actor)
    )
