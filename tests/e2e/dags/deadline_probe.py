"""A probe DAG of the e2e deployment (tests/e2e/test_deadline_e2e.py): ``classify_documents``'
deadline (:func:`~triage.operators.alerts.classify_deadline`) on a task slower than the time a
test leaves to it."""

from __future__ import annotations

import time
from datetime import datetime

from airflow.sdk import DAG, task

from triage.operators.alerts import classify_deadline

with DAG(
    dag_id="deadline_probe",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    is_paused_upon_creation=False,
    deadline=classify_deadline(),
):

    @task
    def slower_than_the_deadline() -> None:
        time.sleep(45)

    slower_than_the_deadline()
