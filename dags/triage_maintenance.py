"""triage_maintenance: retention, daily. Unpaused when Airflow first sees it, like
``reconcile_jobs`` (the day partitions it makes ahead keep the ledger's inserts in their own
day: a maintenance that waits to be unpaused lets them all fall into the default partition).

Makes the next days' partitions of ``job_events`` and ``outbox``, rotates the JSON-lines event
file, and removes what the deployment's retention (Variable ``triage_retention``,
docs/operations.md) says is expired: published outbox events and the transition log by day
partition, classifications of terminal jobs in bounded batches, payload packs no open job
references, rotated event files, reconciliation reports. Nothing open is ever removed (a job not
terminal, an open review, an unsent event, the payload of an open job). Its return value (XCom)
says per kind how many rows or files went and how many bytes.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG

from triage.operators.maintenance import ApplyRetentionOperator
from triage.operators.retry import default_args

with DAG(
    dag_id="triage_maintenance",
    description="Retention: drop expired partitions and files, never anything open; make the coming days' partitions",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    is_paused_upon_creation=False,  # wins over [core] dags_are_paused_at_creation
    tags=["triage", "maintenance"],
    default_args=default_args(
        retries=2,
        retry_delay=timedelta(minutes=5),
        max_retry_delay=timedelta(minutes=30),
        execution_timeout=timedelta(hours=2),
    ),
    doc_md=__doc__,
) as dag:
    ApplyRetentionOperator(task_id="apply_retention")
