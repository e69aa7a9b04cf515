"""train_classifier: the learned classifier, retrained from what reviewers decided. Daily and on demand.

Trains a candidate from every labelled example (reviewers' ``label`` decisions and imported
history; never a model's own labels), holds out a fixed share by a hash of each example's id,
chooses each label's confidence threshold for the target precision, and makes it champion only
if it beats the champion's macro-F1 on the same held-out examples without falling below the
target (the first model becomes champion). Runs of ``classify_documents`` with classifier
``learned`` use the champion. The same examples again train nothing new. docs/learning.md.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.sdk import DAG, Param

from triage.contracts.train_params import param_schemas
from triage.operators.retry import default_args
from triage.operators.train import TrainClassifierOperator

with DAG(
    dag_id="train_classifier",
    description="Train the learned classifier from labelled examples; promote it if it beats the champion",
    schedule="@daily",
    start_date=datetime(2026, 1, 1),
    catchup=False,
    max_active_runs=1,
    tags=["triage", "learning"],
    params={name: Param(**schema) for name, schema in param_schemas().items()},
    default_args=default_args(
        retries=1,
        retry_delay=timedelta(minutes=5),
        max_retry_delay=timedelta(minutes=15),
        execution_timeout=timedelta(hours=1),
    ),
    doc_md=__doc__,
) as dag:
    TrainClassifierOperator(task_id="train")
