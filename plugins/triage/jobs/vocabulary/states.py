"""The job state machine: one vocabulary, declared once, mirrored by ``triage.job_status``.

The allowed transitions below are data. Migrations copy them into ``triage.job_transitions``
and a trigger refuses every other move, so ad hoc SQL is held to the same rules as this code.
A test checks that this table and the database's are equal.

The groups of states (:data:`TERMINAL`, :data:`SETTLED`, :data:`UNFINISHED`, …) are named here
once; code and SQL use them rather than listing states. The steps a job goes through and the
event types of the outbox are named here too.
"""

from __future__ import annotations

from enum import StrEnum

from triage.jobs.vocabulary.errors import UnknownStatus


class JobStatus(StrEnum):
    """Where a unit of work is. Values round-trip through PostgreSQL and JSON unchanged."""

    RECEIVED = "received"  # set by retrieval: validated, durable id and idempotency key
    QUEUED = "queued"  # set by retrieval or review (requeue): its event is in the outbox
    RUNNING = "running"  # set by a claim: one attempt owns it under a lease
    WAITING = "waiting"  # set by a step: waits on an external system or a continuation
    COMPLETED = "completed"  # set by persistence: output and state in one transaction
    RETRYABLE_FAILED = "retryable_failed"  # set by a step or reconciliation: next_attempt_at set
    MANUAL_REVIEW = "manual_review"  # set by a step, a callback or reconciliation: review row open
    TERMINAL_FAILED = "terminal_failed"  # set by a step or review (reject): nothing retries it automatically


S = JobStatus

INITIAL_STATES: frozenset[JobStatus] = frozenset({S.RECEIVED, S.QUEUED, S.MANUAL_REVIEW})
"""States a job may be created in. ``manual_review`` is for input that is malformed on arrival:
it is registered (nothing is lost) and goes straight to a human."""

TRANSITIONS: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (S.RECEIVED, S.QUEUED),
        (S.RECEIVED, S.MANUAL_REVIEW),
        (S.RECEIVED, S.TERMINAL_FAILED),
        (S.QUEUED, S.RUNNING),
        (S.QUEUED, S.WAITING),  # parked: its dependency is down (an outage), due again at next_attempt_at
        (S.QUEUED, S.COMPLETED),  # picked, classified in process and completed in one transaction (0030)
        (S.QUEUED, S.MANUAL_REVIEW),  # failure callback, reconciliation, or a chunk of one transaction
        (S.QUEUED, S.TERMINAL_FAILED),
        (S.RUNNING, S.QUEUED),  # advanced to its next step, or released unstarted
        (S.RUNNING, S.WAITING),
        (S.RUNNING, S.COMPLETED),
        (S.RUNNING, S.RETRYABLE_FAILED),
        (S.RUNNING, S.MANUAL_REVIEW),
        (S.RUNNING, S.TERMINAL_FAILED),
        (S.WAITING, S.QUEUED),
        (S.WAITING, S.RETRYABLE_FAILED),
        (S.WAITING, S.MANUAL_REVIEW),
        (S.WAITING, S.TERMINAL_FAILED),
        (S.RETRYABLE_FAILED, S.RUNNING),
        (S.RETRYABLE_FAILED, S.WAITING),  # parked on an outage, as from queued
        (S.RETRYABLE_FAILED, S.MANUAL_REVIEW),
        (S.RETRYABLE_FAILED, S.TERMINAL_FAILED),
        (S.MANUAL_REVIEW, S.QUEUED),  # review: requeue
        (S.MANUAL_REVIEW, S.COMPLETED),  # review: resolved with a label
        (S.MANUAL_REVIEW, S.TERMINAL_FAILED),  # review: reject
        (S.TERMINAL_FAILED, S.QUEUED),  # replay by filter: an operator's deliberate retry (0008)
        (S.COMPLETED, S.COMPLETED),  # review: a correction of an audited label (jobs.corrections, 0026)
    }
)
"""Every move the database accepts, as (from, to). Anything else raises."""


class Role(StrEnum):
    """The database roles that move jobs, each a group its deployment's login is a member of
    (:mod:`triage.roles`). PostgreSQL refuses a move to a login of another role (migration 0021)."""

    APP = "triage_app"  # the pipeline: workers, reconciliation, intake
    REVIEW = "triage_review"  # the web service and review_jobs: decisions on reviewed jobs, replays
    MAINTENANCE = "triage_maintenance"  # triage_maintenance: retention only; moves no job


REVIEW_MOVES: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (S.MANUAL_REVIEW, S.QUEUED),
        (S.MANUAL_REVIEW, S.COMPLETED),
        (S.MANUAL_REVIEW, S.TERMINAL_FAILED),
        (S.TERMINAL_FAILED, S.QUEUED),
        (S.COMPLETED, S.COMPLETED),
    }
)
"""The moves only the review role may make: out of ``manual_review``, a replay of a failed job,
and a correction of a completed job's label (the one move that keeps its state: the jobs trigger
takes a change of ``jobs.corrections`` as a move, migration 0026)."""

TRANSITION_ROLES: dict[tuple[JobStatus | None, JobStatus], Role] = {
    **{(None, new): Role.APP for new in INITIAL_STATES},
    **{move: Role.REVIEW if move in REVIEW_MOVES else Role.APP for move in TRANSITIONS},
}
"""Who owns each move, ``(None, state)`` for a job's creation: ``triage.transition_roles``,
checked by the jobs triggers against the session's login (tested equal)."""

TERMINAL: frozenset[JobStatus] = frozenset({S.COMPLETED, S.TERMINAL_FAILED})
"""No automatic step will ever move these again (only a person's replay takes a
``terminal_failed`` job back to ``queued``)."""

REPLAYABLE: frozenset[JobStatus] = frozenset({S.MANUAL_REVIEW, S.TERMINAL_FAILED})
"""What a replay by filter may take back to ``queued`` (:mod:`triage.jobs.sql.moves.replays`)."""

SETTLED: frozenset[JobStatus] = frozenset({S.COMPLETED, S.MANUAL_REVIEW, S.TERMINAL_FAILED})
"""Where a batch's work may rest when its run is over: done, or with a human."""

UNFINISHED: frozenset[JobStatus] = frozenset(set(JobStatus) - SETTLED)
"""Work that an automatic step still owes something to."""

CLAIMABLE: frozenset[JobStatus] = frozenset({S.QUEUED, S.RETRYABLE_FAILED})
"""What a claim may take (``retryable_failed`` only once ``next_attempt_at`` has passed)."""

UNLEASED: frozenset[JobStatus] = frozenset(UNFINISHED - {S.RUNNING})
"""Unfinished work that no lease holds: a failed task's batch may give it up to review."""

OUTAGE_PREFIX = "outage:"
"""The ``status_reason`` of a job parked in ``waiting`` because a dependency is down or busy
(``outage:model``, ``outage:payload_store``; ``outage:rate_limit``: the model budget has no room,
``outage:batch``: a provider batch answers it): not the job's failure, so no attempt
is spent on it, a failed task's callback leaves it alone, and a claim of its batch and step
queues it again once its ``next_attempt_at`` has passed."""

OPEN: frozenset[JobStatus] = frozenset(set(JobStatus) - TERMINAL)
"""Everything a job may still leave: the states whose queue age the report shows."""


class Step(StrEnum):
    """Where in the pipeline a job is (``jobs.step``): the step whose claim takes it next."""

    CLASSIFY = "classify"  # registered here by retrieval; its claims take one classifier version
    PERSIST = "persist"  # advanced here by classify with an accepted label; writes it and completes


class EventType(StrEnum):
    """What an outbox event says happened (``outbox.event_type``). Mirrors
    :data:`triage.contracts.events.EventType`, the contract's literal (a test keeps them equal)."""

    REGISTERED = "job.registered"  # set by retrieval (or reconciliation queueing a received job)
    COMPLETED = "job.completed"  # set by persistence, a reviewer's label, or reconciliation
    REQUEUED = "job.requeued"  # set by review (requeue) and by a replay by filter
    REVIEWED = "job.reviewed"  # set by review (reject)
    NEEDS_REVIEW = "job.needs_review"  # set by every move into manual_review (with its review row)
    FAILED = "job.failed"  # set by every move into terminal_failed (a step, review's reject)


TRANSITION_STEPS: dict[tuple[JobStatus, JobStatus], Step] = {
    (S.QUEUED, S.COMPLETED): Step.CLASSIFY,  # the classifier's answer is the outcome only at classify
}
"""The moves allowed only while the job is at one step (its ``step`` before the move):
``triage.job_transitions.at_step`` (migration 0033), checked by the jobs update trigger (tested
equal). Every other move of :data:`TRANSITIONS` is allowed at any step."""


def is_allowed(old: JobStatus | None, new: JobStatus, step: str | None = None) -> bool:
    """Whether the database accepts ``old -> new`` (``old`` is None for a new job) of a job at
    ``step`` (None: whatever step the move may need)."""
    if old is None:
        return new in INITIAL_STATES
    if (old, new) not in TRANSITIONS:
        return False
    at_step = TRANSITION_STEPS.get((old, new))
    return step is None or at_step is None or step == at_step


def parse_status(value: str) -> JobStatus:
    """The state named ``value`` (a database or user value); :class:`UnknownStatus` otherwise."""
    try:
        return JobStatus(value)
    except ValueError:
        raise UnknownStatus(f"{value!r} is not a job state; states: {', '.join(s.value for s in JobStatus)}") from None
