"""Resuming work parked on an outage through Airflow itself (``reconcile_jobs``).

The reconciliation rule :mod:`triage.reconciliation.outage_resumes` plans which failed
``classify_documents`` and ``classify_intake`` runs to clear; ``plan_outage_resumes`` turns its JSON summary into one
set of keyword arguments per run, and :class:`ResumeOutageRunOperator`, mapped over them, clears
each run (``TriggerDagRunOperator`` with ``reset_dag_run``). Everything goes through the Task SDK
and the Execution API, the task's own channel to Airflow: no REST user, no extra rights, the
same in every deployment.

In Airflow 3.3 ``reset_dag_run`` reaches the run by its id: the Execution API answers 409 for
an existing ``run_id`` and the task's supervisor then clears that run (every task instance,
the run ``queued`` again, its conf unchanged). So the run id given is the run that parked the
batch, which the rule just found in Airflow; the logical date matters only if that run vanished
in between (a new run with the batch's data interval, or a conflict that fails this task).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import task
from airflow.sdk.exceptions import AirflowSkipException

if TYPE_CHECKING:
    from airflow.sdk import Context

log = logging.getLogger(__name__)


class TaskSdkDagRuns:
    """:class:`~triage.reconciliation.outage_resumes.DagRuns` through the Task SDK (the
    Execution API) of a running task instance."""

    def __init__(self, ti: Any) -> None:
        self.ti = ti

    def state(self, dag_id: str, run_id: str) -> str | None:
        # Counted first: asked for a run that does not exist, the state call raises.
        if self.ti.get_dr_count(dag_id=dag_id, run_ids=[run_id]) == 0:
            return None
        return str(self.ti.get_dagrun_state(dag_id=dag_id, run_id=run_id))

    def paused(self, dag_id: str) -> bool:
        return bool(self.ti.get_dag(dag_id).is_paused)


def _logical_date(batch_key: str) -> str | None:
    """The logical date of the run that owns ``batch_key``: a day's batch is a data interval, and a
    manual run's interval ends at its logical date; a batch without one (``intake``, whose runs
    are asset-triggered) has none, and its run is cleared by its id alone."""
    _start, sep, end = batch_key.partition("/")
    return end if sep else None


def resume_requests(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The keyword arguments of :class:`ResumeOutageRunOperator`, one set per run the
    reconciliation planned to clear (its JSON summary); none in a dry run."""
    from triage.reconciliation.outage_resumes import planned_resumes

    return [
        {
            "trigger_dag_id": plan["dag_id"],
            "trigger_run_id": plan["run_id"],
            "logical_date": _logical_date(plan["batch_key"]),
            "batch_key": plan["batch_key"],
            "parked": plan["parked"],
        }
        for plan in planned_resumes(summary)
    ]


@task(task_id="plan_outage_resumes")
def plan_outage_resumes(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs ``reconcile`` planned to clear, as the mapped resume task's arguments."""
    requests = resume_requests(summary)
    log.info(
        "outage resumes planned: %d %s",
        len(requests),
        [f"{r['trigger_run_id']} ({r['batch_key']}: {r['parked']} parked)" for r in requests],
    )
    return requests


class ResumeOutageRunOperator(TriggerDagRunOperator):
    """Clear a failed run whose batch has jobs parked on an outage, all due, so that it runs again.

    Checks the run once more right before clearing it: a run someone cleared or triggered in the
    seconds since the plan is queued or running, and is left alone (the task is skipped), as is a
    run that is gone or a DAG paused since. That check also makes a retry of this task safe: a
    try that cleared the run and failed afterwards leaves it queued, and the retry skips it.

    :param batch_key: the batch the run resumes (for the log).
    :param parked: how many jobs of it are parked (for the log).
    """

    def __init__(self, *, batch_key: str, parked: int, **kwargs: Any) -> None:
        super().__init__(reset_dag_run=True, wait_for_completion=False, **kwargs)
        self.batch_key, self.parked = batch_key, parked

    def execute(self, context: Context) -> None:
        from triage.reconciliation.outage_resumes import ACTIVE_RUN_STATES

        runs = TaskSdkDagRuns(context["ti"])
        dag_id, run_id = self.trigger_dag_id, str(self.trigger_run_id)
        state = runs.state(dag_id, run_id)
        if state is None or state in ACTIVE_RUN_STATES:
            raise AirflowSkipException(f"{dag_id}/{run_id} not cleared: it is {state or 'gone'} now")
        if runs.paused(dag_id):
            raise AirflowSkipException(f"{dag_id}/{run_id} not cleared: {dag_id} is paused now")
        log.info(
            "resuming %s: clearing %s/%s (%s) for %d jobs parked on an outage, all due",
            self.batch_key,
            dag_id,
            run_id,
            state,
            self.parked,
        )
        super().execute(context)
