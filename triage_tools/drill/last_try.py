"""The drill's kill on the last try: ``classify`` SIGKILLed on its final try while it holds a
claim, so Airflow marks it failed and no failure callback ever runs.

One more date (two days before the drill's first) is run, once the drill's other runs are over,
with the ``llm`` classifier against the drill's model on loopback
(:class:`~triage_tools.drill.model.FakeModel`). The model is down
(``503``, ``Retry-After: 2``), so each of ``classify``'s tries opens its circuit breaker and
fails at once, and its retry policy brings the next try after two seconds. When a try is the
last (``try_number`` is ``max_tries + 1``), the model hangs: the try claims the batch and waits
on its calls, and the drill SIGKILLs its task process while it holds the claim
(:meth:`~triage_tools.drill.faults.FaultInjector.kill_on_last_try`). Airflow has nothing left
to retry: the task and the run end ``failed``, and the callback that would have sent the jobs
to review never runs. Their only way out is reconciliation's Airflow view, which the drill's
reconciliation rounds run as the deployment's ``triage_reconcile``.

Judged by :func:`last_try_invariants`: the kill happened on the last try under a claim; the
run failed; no job of the date is left unfinished; every job the killed try held is in
``manual_review`` with the cross-check's reason (``airflow_task_failed``), moved there by
reconciliation (its event, its open review row with ``repaired_by``); no failure callback of
the killed task moved anything; and the date's history agrees with its jobs (each job's last
event is its state, no outbox event left unsent).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import job_events, jobs, manual_review, outbox
from triage.jobs.sql.expressions import unsent_event
from triage.jobs.vocabulary.models import REPAIRER
from triage.jobs.vocabulary.states import UNFINISHED
from triage.jobs.vocabulary.states import JobStatus as S
from triage.reconciliation.airflow_view import REASON
from triage_tools.drill.invariants import Invariant
from triage_tools.run import batch_key_of


@dataclass(frozen=True)
class LastTryPhase:
    day: date
    documents: int
    seed: int
    lease_seconds: int = 30

    @property
    def run_id(self) -> str:
        return f"chaos_last_try__{self.day.isoformat()}"

    @property
    def batch_key(self) -> str:
        return batch_key_of(self.day)

    def conf(self) -> dict[str, Any]:
        return {
            "documents": self.documents,
            "classifier": "llm",
            "lease_seconds": self.lease_seconds,
            "drill": {"seed": self.seed},
        }


@dataclass(frozen=True)
class LastTryKill:
    """What the drill killed: the try's lease owner (``dag/run/task/map_index/tryN``), its try
    number and Airflow's ``max_tries``, the jobs its claim held at that moment, and when."""

    owner: str
    try_number: int
    max_tries: int
    job_ids: tuple[str, ...]
    killed_at: float = 0.0  # time.monotonic()

    @property
    def callback_actor(self) -> str:
        """The actor the killed task's failure callback would have written (``callbacks.py``)."""
        return f"{self.owner.rsplit('/', 1)[0]}/failure_callback"


def held_jobs(conn: sa.Connection, owner: str) -> list[str]:
    """The running jobs whose lease ``owner`` holds."""
    rows = conn.execute(sa.select(jobs.c.id).where(jobs.c.status == S.RUNNING.value, jobs.c.lease_owner == owner))
    return sorted(str(r[0]) for r in rows)


def last_try_invariants(
    conn: sa.Connection, phase: LastTryPhase, kill: LastTryKill | None, run_state: str | None
) -> list[Invariant]:
    """What the kill on the last try must leave once reconciliation has settled the drill."""
    of_batch = jobs.c.batch_key == phase.batch_key
    held = list(kill.job_ids) if kill is not None else []
    unfinished = conn.execute(
        sa.select(sa.func.count()).where(of_batch, jobs.c.status.in_([s.value for s in UNFINISHED]))
    ).scalar_one()
    moved_by_view = sa.exists().where(
        job_events.c.job_id == jobs.c.id,
        job_events.c.to_status == S.MANUAL_REVIEW.value,
        job_events.c.reason == REASON,
        job_events.c.actor == REPAIRER,
    )
    review_by_view = sa.exists().where(
        manual_review.c.job_id == jobs.c.id,
        manual_review.c.resolved_at.is_(None),
        manual_review.c.reason == REASON,
        manual_review.c.context["repaired_by"].astext == REPAIRER,
    )
    settled_by_view = sa.and_(
        jobs.c.status == S.MANUAL_REVIEW.value, jobs.c.status_reason == REASON, moved_by_view, review_by_view
    )
    elsewhere = (
        conn.execute(sa.select(sa.func.count()).where(jobs.c.id.in_(held), sa.not_(settled_by_view))).scalar_one()
        if held
        else 0
    )
    callback_moves = (
        conn.execute(
            sa.select(sa.func.count())
            .select_from(job_events.join(jobs, jobs.c.id == job_events.c.job_id))
            .where(of_batch, job_events.c.actor == kill.callback_actor)
        ).scalar_one()
        if kill is not None
        else 0
    )
    last_event = (
        sa.select(job_events.c.to_status)
        .where(job_events.c.job_id == jobs.c.id)
        .order_by(job_events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    drifted = conn.execute(
        sa.select(sa.func.count()).where(of_batch, last_event.is_distinct_from(jobs.c.status))
    ).scalar_one()
    unsent = conn.execute(
        sa.select(sa.func.count())
        .select_from(outbox.join(jobs, jobs.c.id == outbox.c.job_id))
        .where(of_batch, unsent_event())
    ).scalar_one()
    tries = f"try {kill.try_number} of {kill.max_tries + 1}" if kill is not None else "no kill"
    return [
        Invariant(
            "last_try_killed",
            f"classify was SIGKILLed on its last try holding a claim ({tries}, {len(held)} jobs)",
            int(kill is None or not held or kill.try_number != kill.max_tries + 1),
        ),
        Invariant(
            "last_try_run_failed",
            f"Airflow gave the run up: it ended failed (it was {run_state})",
            int(run_state != "failed"),
        ),
        Invariant(
            "last_try_nothing_left",
            "no job of the killed run's date left received, queued, running, waiting or retryable_failed",
            int(unfinished),
        ),
        Invariant(
            "last_try_settled_by_cross_check",
            f"each job the killed try held is in manual_review ({REASON}), moved by reconciliation's Airflow view",
            int(elsewhere),
        ),
        Invariant(
            "last_try_no_callback",
            "no failure callback of the killed task moved a job (Airflow called none)",
            int(callback_moves),
        ),
        Invariant(
            "last_try_history_agrees",
            "each job of the date's last event is its state, and none of its outbox events is unsent",
            int(drifted) + int(unsent),
        ),
    ]
