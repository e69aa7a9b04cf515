"""review_jobs: a reviewer resolves jobs in manual review with a label, a requeue or a rejection.

On demand only: trigger it from the UI (the form asks for the job ids, the decision, the label
for a "label" decision, a note) or the CLI::

    ./airflow.sh dags trigger review_jobs --conf '{"job_ids": ["…"], "decision": "label", "label": "billing"}'

The Airflow user who triggered the run is recorded as the reviewer in the review row and the
transition log. Each job is decided on its own, in its own transaction; the same decision twice
changes nothing. The task fails (without retry) if any job was refused, after applying the
others, and its log lists every job: applied, already applied, or refused and why. A label is
then sent to the label provider (``triage_label_action``) when one is configured; one the
provider did not confirm fails the task for its retry, which sends it again under the same key.

Decision ``replay`` selects the jobs by a filter instead of ids (reason, error class, states
``manual_review``/``terminal_failed``, source, batch, failed since/until, limit up to 10,000)
and is a dry run unless ``dry_run`` is false: the log and the return value then say how many
jobs match and which. Applied, the jobs are requeued as fresh jobs as the triggering user, with
the note; the same replay submitted again changes nothing (``already applied``)::

    ./airflow.sh dags trigger review_jobs --conf '{"decision": "replay", "reason": "retries_exhausted"}'
"""

from __future__ import annotations

from datetime import datetime

from airflow.sdk import DAG, Param

from triage.operators.review import REVIEW_DEFAULT_ARGS, ReviewJobsOperator
from triage.review.config import form_label_names, param_schemas

with DAG(
    dag_id="review_jobs",
    description="Resolve jobs in manual review (label, requeue, reject) or replay failed jobs by filter, as the triggering user",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["triage", "review"],
    params={name: Param(**schema) for name, schema in param_schemas(form_label_names()).items()},
    default_args=REVIEW_DEFAULT_ARGS,
    doc_md=__doc__,
) as dag:
    ReviewJobsOperator(task_id="apply_decision")
