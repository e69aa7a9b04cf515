"""Outages heal themselves under a real scheduler (issue #13, item 3): a ``classify_documents``
run whose model answers 503 to every call fails after all its tries with its batch parked; once
the model is back, a ``reconcile_jobs`` run (no human action on the failed run) clears it
through the Task SDK, and the scheduler runs it again to success: every job completed on its
first real attempt, none in review, the run cleared once.

The API server, scheduler and DAG processor are real (LocalExecutor task processes); the model
is the fake OpenAI-compatible server on loopback, switched from down to up.

Owns ``classify_documents``' run ``outage`` (yesterday's logical date, its batch), ``reconcile_jobs``'
run ``heal``, and the repairs that name its run."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from typing import Any

import sqlalchemy as sa

from tests.e2e.conftest import E2E
from tests.fakes.openai_server import Reply
from tests.harness.airflow import list_runs, task_states, wait_for_runs
from tests.ledger.test_outage import Switch

DOCUMENTS = 30  # the first claim opens the breaker (503s for 3 jobs' calls: the all-down rule)


def run_state(env: dict[str, str], dag_id: str, run_id: str) -> str | None:
    return next((r["state"] for r in list_runs(env, dag_id) if r["run_id"] == run_id), None)


def wait_for_state(env: dict[str, str], dag_id: str, run_id: str, wanted: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (state := run_state(env, dag_id, run_id)) != wanted:
        assert state not in {"failed", "success"} - {wanted}, f"{dag_id}/{run_id} ended {state}"
        assert time.monotonic() < deadline, f"{dag_id}/{run_id} is {state} after {timeout:.0f}s"
        time.sleep(1.0)


def clear_number(e2e: E2E, run_id: str) -> int:
    engine = sa.create_engine(e2e.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT clear_number FROM dag_run WHERE dag_id = 'classify_documents' AND run_id = :r"),
                    {"r": run_id},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def ledger(e2e: E2E, day: datetime) -> dict[tuple[Any, ...], int]:
    """The jobs of the run's batch (its data interval starts or ends on ``day``) by state."""
    engine = e2e.deployment.engine()
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT status, attempt, status_reason, count(*) FROM triage.jobs"
                    " WHERE strpos(batch_key, :day) > 0 GROUP BY 1, 2, 3"
                ),
                {"day": day.isoformat()},
            ).all()
            return {tuple(r[:-1]): r[-1] for r in rows}
    finally:
        engine.dispose()


def test_reconcile_jobs_resumes_a_failed_outage_run_once_the_model_is_back(e2e: E2E) -> None:
    # No scheduled runs on the e2e deployment: a reconcile_jobs run at a quarter-hour boundary
    # during the outage would resume the failed run too (rightly: its parked jobs are due), and
    # the test would count two resumes (CI of 3b485e1). Triggered runs still run.
    switch = Switch(Reply.status_only(503, retry_after="1"))
    e2e.model.responder = switch
    af, model = e2e.airflow, e2e.model
    day = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=1)
    calls_before = model.request_count
    af.post(
        "/api/v2/dags/classify_documents/dagRuns",
        {
            "dag_run_id": "outage",
            "logical_date": day.isoformat().replace("+00:00", "Z"),
            "conf": {"documents": DOCUMENTS, "classifier": "llm"},
        },
    )
    af.unpause("classify_documents")
    wait_for_state(af.env, "classify_documents", "outage", "failed", timeout=420)
    assert ledger(e2e, day) == {("waiting", 0, "outage:model"): DOCUMENTS}, af.logs(80)
    assert reviews(e2e, day) == 0
    calls_in_outage = model.request_count - calls_before
    switch.down = None  # the model is back; the parked jobs were due 1 s after parking
    assert clear_number(e2e, "outage") == 0
    af.post("/api/v2/dags/reconcile_jobs/dagRuns", {"dag_run_id": "heal", "logical_date": None})
    wait_for_state(af.env, "reconcile_jobs", "heal", "success", timeout=300)
    states = task_states(af.env, "reconcile_jobs", "heal")
    assert states["resume_outage_run[0]"] == "success", states
    assert "resume_outage_run[1]" not in states
    wait_for_state(af.env, "classify_documents", "outage", "success", timeout=420)
    runs = wait_for_runs(
        af.env, "classify_documents", 1, ("success",), timeout=30, where=lambda r: r["run_id"] == "outage"
    )

    assert [r["run_id"] for r in runs] == ["outage"]
    assert clear_number(e2e, "outage") == 1
    assert ledger(e2e, day) == {("completed", 1, "completed"): DOCUMENTS}
    assert reviews(e2e, day) == 0
    assert calls_in_outage >= 3  # the breaker saw 3 jobs' calls fail before parking the batch
    engine = e2e.deployment.engine()
    try:
        with engine.connect() as conn:
            summaries = conn.execute(sa.text("SELECT summary FROM triage.reconciliation_runs ORDER BY id")).scalars()
            resumes = [r for s in summaries for r in s["repairs"] if r["action"] == "outage_resume_requested"]
    finally:
        engine.dispose()
    ours = [(r["count"], r["detail"]) for r in resumes if str(r["detail"]).startswith("classify_documents/outage ")]
    assert ours == [(DOCUMENTS, "classify_documents/outage cleared to resume them")]


def reviews(e2e: E2E, day: datetime) -> object:
    """Review rows of the run's batch that say something went wrong: an audit sample of a
    completed job (``audit_rate``, issue #27) is the product working, not the outage's mark."""
    return e2e.deployment.scalar(
        "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
        " WHERE strpos(j.batch_key, :day) > 0 AND r.reason <> 'audit_sample'",
        day=day.isoformat(),
    )
