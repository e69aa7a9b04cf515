"""The jobs a task's final try held when it died: the conditions and the check that counts them
(read-only, like :mod:`.checks`); the fenced repair that sends them to review
is :mod:`triage.jobs.sql.moves.last_tries` (like :mod:`triage.jobs.sql.moves.repairs`), run by the
store's part :class:`triage.jobs.store.last_tries.DeadLastTries`.

A SIGKILL (an OOM kill, a pod eviction) on a classifying task's last try leaves the jobs it
held ``running`` under a lease nobody renews. Reconciliation's lease rule gives them back as
``retryable_failed``, due at once; but Airflow retries that task no more and no failure
callback ran, so unless another run of the date comes, nothing will claim them. Where
Airflow's API answers, its view settles them (``batch_sent_to_review``); this is the rule that
needs only the ledger (``docs/reconciliation.md``, rule ``dead_last_tries``).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.schema import job_events, jobs
from triage.jobs.sql.expressions import NOW, status_literal
from triage.jobs.sql.expressions import seconds_param as seconds
from triage.jobs.sql.reads.checks import batch_idle, in_state, summarise
from triage.jobs.vocabulary.states import JobStatus as S

RULE = "dead_last_tries"
TASK_FAILED = "airflow_task_failed"
"""The review reason: the failure callback's, and the Airflow view's, for the same case."""
TRY_NUMBER = r"/try([0-9]+)$"
"""The try number at the end of a Triage task's lease owner (``dag/run/task/map_index/tryN``)."""


def last_holder() -> ColumnElement[Any]:
    """Who held the job last: the actor of its latest claim, which the trigger logs as the new
    lease owner (a Triage task's is ``dag/run/task/map_index/tryN``). Only the log's days since
    the job was created are read (the log is partitioned by day)."""
    return (
        sa.select(job_events.c.actor)
        .where(
            job_events.c.job_id == jobs.c.id,
            job_events.c.to_status == status_literal(S.RUNNING),
            job_events.c.at >= jobs.c.created_at,
        )
        .order_by(job_events.c.id.desc())
        .limit(1)
        .scalar_subquery()
    )


def last_try_dead() -> list[ColumnElement[bool]]:
    """Retryable jobs whose last holder was its task's final try (try number ``:final_try``:
    Airflow retries that task no more) and that nobody came back for: due for ``:threshold``
    seconds in a batch idle for as long (:func:`~triage.jobs.sql.reads.checks.batch_idle`: nothing
    written, none ``running``, none ``waiting``).

    Exactly the final try, never a later one: a task cleared by hand goes on counting (try 5,
    6, 7 after a final try 4), each with retries left, and its last try number is unknown to the
    ledger. A holder of a DAG whose failed tasks Airflow's view judged in this run
    (``:viewed_prefix``, ``dag/``; NULL: none) is left to that view, which knows whether another
    run of the batch is queued or running. The idle batch guards what the try number cannot: a
    sibling map index or another run of the same date claims and writes the batch within a
    retry delay. A holder that is not a Triage task (no ``tryN``) never matches."""
    holder = last_holder()
    holder_try = sa.cast(sa.func.substring(holder, TRY_NUMBER), sa.Integer)
    viewed = sa.bindparam("viewed_prefix", type_=sa.Text)
    return [
        in_state(S.RETRYABLE_FAILED),
        jobs.c.next_attempt_at < NOW - seconds("threshold"),
        holder_try == sa.bindparam("final_try", type_=sa.Integer),
        sa.or_(viewed.is_(None), ~sa.func.starts_with(holder, viewed)),
        batch_idle(),
    ]


@cache
def dead_last_tries() -> sa.Select[Any]:
    """The check: how many jobs :func:`last_try_dead` finds, the oldest due time, a sample."""
    rows = sa.select(jobs.c.id, jobs.c.next_attempt_at.label("since")).where(*last_try_dead()).subquery()
    return summarise(rows)


def viewed_prefix(viewed_dag: str | None) -> str | None:
    """The lease owners' prefix (``dag/``) of a DAG Airflow's view judged, for ``:viewed_prefix``."""
    return None if viewed_dag is None else f"{viewed_dag}/"
