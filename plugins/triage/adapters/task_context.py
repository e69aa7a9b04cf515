"""What a task's context names for the ledger: the batch it works on, and the lease owner of this
try (the operators' claims and the failure callback's moves agree on both)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

if TYPE_CHECKING:
    from airflow.sdk import Context


def fixed_batch(task: Any) -> str | None:
    """The batch a task was given (``batch=``), also on a mapped task not yet unmapped (the
    failure callback may get one); None: the run's data interval names it."""
    found = getattr(task, "batch", None)
    if found is None:
        found = (getattr(task, "partial_kwargs", None) or {}).get("batch")
    return str(found) if found else None


def batch_key(context: Context) -> str:
    """The task's batch (``classify_intake``'s tasks: ``intake``), else the DAG run's data
    interval: the unit of work that retries, callbacks and reports name."""
    fixed = fixed_batch(context.get("task"))
    if fixed is not None:
        return fixed
    start, end = context.get("data_interval_start"), context.get("data_interval_end")
    if start is None or end is None:
        raise AirflowFailException("this run has no data interval; classify_documents needs one to know its documents")
    from triage.jobs.vocabulary.models import batch_key_for

    return batch_key_for(start, end)


def map_index(context: Context) -> int:
    """The task instance's map index; -1 when it is not mapped (the SDK may also say None)."""
    index = getattr(context["ti"], "map_index", None)
    return -1 if index is None else int(index)


def run_prefix(context: Context) -> str:
    """``dag/run/``: the leases, and the logged moves, of every task of this DAG run start with it."""
    ti = context["ti"]
    return f"{ti.dag_id}/{ti.run_id}/"


CLOCK_SLACK = timedelta(hours=1)
"""How far the ledger database's clock (which stamps ``job_events.at``) may run behind the
Airflow metadata database's (against which the scheduler holds a run until its ``run_after``)
before :func:`run_began_after` would miss a move of the run. No skew at all when both databases
are on one PostgreSQL server, as in ``make up``."""


def run_began_after(context: Context) -> datetime | None:
    """A time before every move this DAG run logged: its ``run_after`` less :data:`CLOCK_SLACK`.

    The scheduler starts no task of a run before the metadata database's ``now()`` reaches its
    ``run_after`` (``airflow.models.dagrun.DagRun``'s queued and running queries), for scheduled,
    manual, backfill and asset-triggered runs alike; a clear leaves ``run_after`` as it was, so a
    cleared run still finds its first tries' moves. ``dag.test(run_after=...)`` with a future
    time is the one path that runs before it; nothing here passes one. For a run of an old date
    (a backfill, a catch-up) the bound is far back: the read stays right, only slower. None when
    the context has no run (the read is then unbounded)."""
    run_after = getattr(context.get("dag_run"), "run_after", None)
    return None if run_after is None else run_after - CLOCK_SLACK


def owner_prefix(context: Context) -> str:
    """``dag/run/task/map_index/``: leases of every try of this task start with it.

    Unambiguous as long as run ids hold no ``/`` (Airflow's default ``allowed_run_id_pattern``
    refuses it); the trailing ``/`` keeps map index 1 apart from 10.
    """
    return f"{run_prefix(context)}{context['ti'].task_id}/{map_index(context)}/"


def lease_owner(context: Context) -> str:
    return f"{owner_prefix(context)}try{context['ti'].try_number}"
