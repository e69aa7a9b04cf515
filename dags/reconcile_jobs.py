"""reconcile_jobs: the backstop. Every 15 minutes, and on demand with typed params; unpaused
when Airflow first sees it (a backstop that waits for someone to unpause it is no backstop),
even where ``dags_are_paused_at_creation`` pauses every other new DAG (docker-compose.yaml).

Returns expired leases, finds work stuck in any state past its threshold, republishes old
unsent outbox events, checks that jobs, labels, review rows and Airflow's own task states agree,
repairs only what is certain (through allowed transitions, fenced), and reports: Markdown in the
task log, an HTML page under the reports folder, and a JSON summary in XCom and in
``triage.reconciliation_runs``. Tick "dry run" in the form to see findings without repairs.

It also resumes work parked on a dependency outage once it is due (issue #13): ``reconcile``
plans which failed ``classify_documents`` or ``classify_intake`` runs to clear (a batch whose
parked jobs are all due, no run of it active, at most ``max_outage_resumes``; the report says why
any other parked batch waits), ``plan_outage_resumes`` hands the plan on, and
``resume_outage_run``, mapped over it, clears each run through the Task SDK
(``TriggerDagRunOperator`` with ``reset_dag_run``); with nothing to resume it is skipped. A
dependency still down parks the jobs again, and the next resume waits for their new due time.

Its tasks have no ``on_failure_callback``: the callback of ``classify_documents`` moves a batch
to review, and a reconciliation run has no batch. A failed reconciliation changes nothing that
the next one (15 minutes later) will not redo.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from triage.operators.outage_resume import ResumeOutageRunOperator, plan_outage_resumes
from triage.operators.reconcile import ReconcileJobsOperator
from triage.operators.retry import default_args
from triage.reconciliation.params import param_schemas

with DAG(
    dag_id="reconcile_jobs",
    description="Return expired leases, find stuck work, check consistency, repair what is certain, report",
    schedule="*/15 * * * *",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # wins over [core] dags_are_paused_at_creation
    tags=["triage", "reconciliation"],
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    default_args=default_args(retries=2, max_retry_delay=timedelta(minutes=5), execution_timeout=timedelta(minutes=10)),
    doc_md=__doc__,
) as dag:
    reconcile = ReconcileJobsOperator(task_id="reconcile")
    ResumeOutageRunOperator.partial(task_id="resume_outage_run").expand_kwargs(
        plan_outage_resumes(reconcile.output)  # type: ignore[arg-type]  # an XComArg: Airflow passes the summary at run time
    )
