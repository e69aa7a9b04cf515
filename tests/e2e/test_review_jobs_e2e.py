"""review_jobs through the running e2e deployment: the trigger form's REST twin (the run carries
the triggering user, who becomes the reviewer) and the human-in-the-loop question of
``review_jobs_interactive``, answered through the API as the Required-actions page does.

Owns the jobs it registers (a batch of their own: ``jobs_in_review``) and the runs it triggers."""

from __future__ import annotations

import time
import urllib.parse
import uuid

from tests.airflow.test_review_jobs import _awaiting, _finished, jobs_in_review, review_row, wait_for
from tests.e2e.conftest import E2E
from tests.harness.airflow import task_log, task_states


def test_reviewers_are_the_airflow_users_of_the_form_and_the_question(e2e: E2E) -> None:
    deployment = e2e.deployment
    labelled, asked = jobs_in_review(deployment, 2)
    dags = ["review_jobs", "review_jobs_interactive"]
    af = e2e.airflow
    for dag_id in dags:
        af.unpause(dag_id)
    # the trigger form posts this
    run = af.post(
        "/api/v2/dags/review_jobs/dagRuns",
        {"logical_date": None, "conf": {"job_ids": [labelled], "decision": "requeue"}},
    )
    user = run["triggering_user_name"]
    assert user
    try:
        wait_for(
            lambda: task_states(af.env, "review_jobs", run["dag_run_id"]).get("apply_decision") == "success",
            timeout=300,
            what="review_jobs to apply the decision",
        )
    except AssertionError:
        now = task_states(af.env, "review_jobs", run["dag_run_id"])
        log = task_log(af.env, "review_jobs", run["dag_run_id"], "apply_decision")
        raise AssertionError(
            f"timed out waiting for review_jobs to apply the decision: {now}\n{log}\n{af.logs(100)}"
        ) from None
    assert review_row(deployment, labelled) == ("queued", "requeued", user, None, user)

    # the question: wait until it is asked, answer it as the Required-actions page does
    asking = af.post("/api/v2/dags/review_jobs_interactive/dagRuns", {"logical_date": None, "conf": {"job_id": asked}})
    run_id = urllib.parse.quote(asking["dag_run_id"], safe="")
    path = f"/api/v2/dags/review_jobs_interactive/dagRuns/{run_id}/taskInstances/ask_reviewer/-1/hitlDetails"
    detail = wait_for(lambda: _awaiting(af, path), what="the question to be asked")
    assert asked in detail["subject"]
    assert "billing" in detail["body"]
    assert "file:///payloads/" in detail["body"]
    # Answer as a human would, not within a second of the question: in Airflow 3.3.2 an answer
    # that beats the scheduler's handling of the parked process's exit is taken for a state
    # changed externally, and the question is asked again (its retry). A reviewer answers
    # the question again, and so does this test: each try is answered once, 15 s after it is
    # asked (5 s lost both tries once on the shared e2e deployment, other modules' runs beside).
    answered: dict[int, str] = {}

    def answer_until_applied() -> dict[str, str | None] | None:
        states = _finished(af, asking["dag_run_id"])
        if states is not None:
            return states
        detail = _awaiting(af, path)
        attempt = int((detail or {}).get("task_instance", {}).get("try_number") or 0)
        if detail is not None and attempt not in answered:
            time.sleep(15)
            answer = af.patch(path, {"chosen_options": ["Label: shipping"], "params_input": {"note": "a parcel"}})
            answered[attempt] = answer["responded_by"]["name"]
        return None

    try:
        states = wait_for(answer_until_applied, timeout=420, what="the answer")
    except AssertionError:
        now = task_states(af.env, "review_jobs_interactive", asking["dag_run_id"])
        raise AssertionError(f"the answer was not applied: {now}, {af.get(path)}\n{af.logs(200)}") from None
    responder = next(iter(answered.values()))
    assert states["apply_answer"] == "success", f"{states}\n{af.logs()}"
    assert review_row(deployment, asked) == ("completed", "labelled", responder, "a parcel", responder)
    assert (
        deployment.scalar("SELECT label FROM triage.document_labels WHERE job_id = :j", j=uuid.UUID(asked))
        == "shipping"
    )
