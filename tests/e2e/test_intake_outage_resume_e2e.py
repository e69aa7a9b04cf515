"""Parked intake work heals itself under a real scheduler (issue #25, finding 4): documents posted
to intake while the model answers 503 are parked by the ``classify_intake`` run, which fails
after its tries; once the model is back, one ``reconcile_jobs`` run (no human action) clears
that run by its id (it has no logical date) through the Task SDK, and the run classifies every
document.

The API server (with the Triage plugin and its intake), scheduler and DAG processor are real;
the model is the fake OpenAI-compatible server on loopback, switched from down to up. Scheduling
is off on the e2e deployment (no quarter-hour ``reconcile_jobs`` run may resume it first), so the
run is triggered with no logical date, as an asset-triggered one has none.

Owns the ``intake`` batch, ``classify_intake``' run ``intake_outage`` and ``reconcile_jobs``' run
``heal_intake``."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa

from tests.e2e.conftest import E2E
from tests.e2e.test_outage_resume_e2e import wait_for_state
from tests.fakes.openai_server import Reply
from tests.harness.airflow import task_states
from tests.ledger.test_outage import Switch

DOCUMENTS = 6
RUN = "intake_outage"
HEAL = "heal_intake"


def ledger(e2e: E2E) -> dict[tuple[Any, ...], int]:
    engine = e2e.deployment.engine()
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.text(
                    "SELECT status, status_reason, count(*) FROM triage.jobs WHERE batch_key = 'intake' GROUP BY 1, 2"
                )
            ).all()
            return {tuple(r[:-1]): r[-1] for r in rows}
    finally:
        engine.dispose()


def clear_number(e2e: E2E) -> int:
    engine = sa.create_engine(e2e.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            return int(
                conn.execute(
                    sa.text("SELECT clear_number FROM dag_run WHERE dag_id = 'classify_intake' AND run_id = :r"),
                    {"r": RUN},
                ).scalar_one()
            )
    finally:
        engine.dispose()


def reviews(e2e: E2E) -> object:
    """Intake's review rows that say something went wrong (an audit sample is not one)."""
    return e2e.deployment.scalar(
        "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
        " WHERE j.batch_key = 'intake' AND r.reason <> 'audit_sample'"
    )


def test_reconcile_jobs_resumes_parked_intake_work_once_the_model_is_back(e2e: E2E) -> None:
    switch = Switch(Reply.status_only(503, retry_after="1"))
    e2e.model.responder = switch
    af = e2e.airflow
    batch = {
        "documents": [
            {
                "source": "helpdesk",
                "external_id": f"OUT-{i}",
                "subject": "Refund please",
                "body": f"I was charged twice for order {i}.",
                "received_at": "2026-12-01T09:00:00+00:00",
            }
            for i in range(DOCUMENTS)
        ]
    }
    accepted = af.post("/triage/api/documents", batch)
    assert [d["status"] for d in accepted["documents"]] == ["accepted"] * DOCUMENTS
    af.post("/api/v2/dags/classify_intake/dagRuns", {"dag_run_id": RUN, "logical_date": None})
    wait_for_state(af.env, "classify_intake", RUN, "failed", timeout=420)
    assert ledger(e2e) == {("waiting", "outage:model"): DOCUMENTS}, af.logs(80)
    assert reviews(e2e) == 0

    switch.down = None  # the model is back; the parked jobs were due 1 s after parking
    assert clear_number(e2e) == 0
    af.post("/api/v2/dags/reconcile_jobs/dagRuns", {"dag_run_id": HEAL, "logical_date": None})
    wait_for_state(af.env, "reconcile_jobs", HEAL, "success", timeout=300)
    states = task_states(af.env, "reconcile_jobs", HEAL)
    assert states["resume_outage_run[0]"] == "success", states
    wait_for_state(af.env, "classify_intake", RUN, "success", timeout=420)

    assert clear_number(e2e) == 1
    assert ledger(e2e) == {("completed", "completed"): DOCUMENTS}
    assert reviews(e2e) == 0
