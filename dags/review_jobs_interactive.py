"""review_jobs_interactive: Airflow asks a reviewer about one job and applies the answer.

Trigger it (optionally with a ``job_id``; by default the oldest open review). The run then waits
in the "Required actions" view with the job's ids, review reason, the model's label and
confidence and its payload reference (never the document text). The reviewer picks
"Label: <label>", "Requeue" or "Reject" and may leave a note; the answer is applied as the
user who answered. Airflow 3.3 parks the question in the ``awaiting_input`` state: no triggerer
is needed.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import DAG, Param

from triage.operators.review import REVIEW_DEFAULT_ARGS, ApplyReviewAnswerOperator, PickReviewCaseOperator
from triage.review.cases import options
from triage.review.config import UUID_PATTERN, form_label_names, param_schemas

with DAG(
    dag_id="review_jobs_interactive",
    description="Ask a reviewer about one job in manual review and apply the answer",
    schedule=None,
    start_date=datetime(2026, 1, 1),
    catchup=False,
    tags=["triage", "review"],
    params={
        "job_id": Param(
            None,
            type=["null", "string"],
            pattern=UUID_PATTERN,
            title="Job id",
            description="The job to review; empty: the oldest job waiting for review.",
        ),
        "max_replays": Param(**param_schemas([])["max_replays"]),
    },
    default_args=REVIEW_DEFAULT_ARGS,
    doc_md=__doc__,
) as dag:
    pick_case = PickReviewCaseOperator(task_id="pick_case")
    ask_reviewer = HITLOperator(
        task_id="ask_reviewer",
        subject="{{ ti.xcom_pull(task_ids='pick_case')['subject'] }}",
        body="{{ ti.xcom_pull(task_ids='pick_case')['body'] }}",
        options=options(form_label_names()),
        params={
            "note": Param(
                None,
                type=["null", "string"],
                maxLength=2000,
                title="Note",
                description="Why (kept with the review row). Never paste document text.",
            )
        },
        response_timeout=timedelta(days=7),
    )
    apply_answer = ApplyReviewAnswerOperator(
        task_id="apply_answer", case_task_id="pick_case", answer_task_id="ask_reviewer"
    )

    pick_case >> ask_reviewer >> apply_answer
