"""classify_documents: retrieve → classify → persist → publish events, one data interval a run.

Scheduled daily with real data intervals (a run covers [00:00, 24:00) UTC of its day), catchup
off, backfillable from the CLI. Trigger it from the UI with the typed params form. Per-document
failures never fail a task; a task fails when a dependency is down or retryable work remains,
and Airflow retries it with exponential backoff. When Airflow gives up, the failure callback
moves the batch's unfinished jobs to manual review.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, CronDataIntervalTimetable, Param

from triage.callbacks import on_task_failure
from triage.contracts.run_config import param_schemas
from triage.operators import (
    ClassifyDocumentsOperator,
    PersistLabelsOperator,
    PublishEventsOperator,
    RetrieveDocumentsOperator,
)

with DAG(
    dag_id="classify_documents",
    description="Retrieve documents of a day, classify them, persist labels, publish events",
    schedule=CronDataIntervalTimetable("0 0 * * *", timezone="UTC"),
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=4,
    max_active_tasks=8,
    tags=["triage", "classification"],
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    default_args={
        "owner": "triage",
        "retries": 3,
        "retry_delay": timedelta(seconds=30),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(minutes=15),
        "on_failure_callback": on_task_failure,
    },
    doc_md=__doc__,
) as dag:
    retrieve = RetrieveDocumentsOperator(task_id="retrieve")
    classify = ClassifyDocumentsOperator(task_id="classify")
    persist = PersistLabelsOperator(task_id="persist")
    publish = PublishEventsOperator(task_id="publish_events")

    retrieve >> classify >> persist >> publish
