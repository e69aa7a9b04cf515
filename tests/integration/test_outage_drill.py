"""The outage phase of ``make chaos`` (:mod:`triage_tools.drill.outage`): its confs are runs a
``classify_documents`` run accepts, and its invariants judge a real ledger (no Airflow here;
``tests/dags/test_chaos.py`` runs the whole drill)."""

from __future__ import annotations

from datetime import date

import pytest
import sqlalchemy as sa

from tests.integration.helpers import new_jobs
from triage.contracts.run_config import ClassifyRunConfig
from triage.jobs.models import ClassificationRecord, Complete, SendToReview
from triage.jobs.store import JobStore
from triage_tools.drill.outage import OutagePhase, outage_invariants

PHASE = OutagePhase(date(2026, 9, 30), documents=6, seed=7)
RAN = {PHASE.outage_run: "failed", PHASE.recovery_run: "success"}


def test_the_outage_conf_fails_every_call_with_a_retry_after_and_the_recovery_conf_none() -> None:
    outage = ClassifyRunConfig.model_validate(PHASE.outage_conf())
    assert (outage.drill.transient_error_rate, outage.drill.retry_after_seconds) == (1.0, 2.0)
    recovered = ClassifyRunConfig.model_validate(PHASE.recovery_conf())
    assert not recovered.drill.injects_faults
    assert recovered.drill.seed == outage.drill.seed == 7  # the same documents


def violations(store: JobStore, ran: dict[str, str]) -> dict[str, int]:
    with store.engine.connect() as conn:
        return {i.name: i.violations for i in outage_invariants(conn, PHASE, ran)}


def finish(store: JobStore, *, review_one: bool = False, attempts: int = 1) -> None:
    store.register(new_jobs(6), batch_key=PHASE.batch_key, step="classify", max_attempts=3)
    for _ in range(attempts - 1):  # a spent attempt: claimed and given up as retryable
        claim = store.claim(batch_key=PHASE.batch_key, step="classify", limit=1, lease_seconds=60, owner="t")
        with store.transaction("t") as conn:
            conn.execute(
                sa.text(
                    "UPDATE triage.jobs SET status = 'retryable_failed', next_attempt_at = now(),"
                    " lease_owner = NULL, lease_token = NULL, lease_expires_at = NULL"
                    " WHERE id = :id"
                ),
                {"id": claim.jobs[0].id},
            )
    claim = store.claim(batch_key=PHASE.batch_key, step="classify", limit=10, lease_seconds=60, owner="t")
    record = ClassificationRecord(label="billing", confidence=0.9, outcome="accepted", classifier_version="keyword-v1")
    outcomes: list[Complete | SendToReview] = [Complete(j.id, j.attempt, classification=record) for j in claim.jobs]
    if review_one:
        outcomes[0] = SendToReview(claim.jobs[0].id, claim.jobs[0].attempt, "airflow_task_failed")
    store.record(claim, outcomes)


def test_a_healed_outage_breaks_nothing(store: JobStore) -> None:
    finish(store)
    assert set(violations(store, RAN).values()) == {0}


@pytest.mark.parametrize(
    ("review_one", "attempts", "ran", "broken"),
    [
        pytest.param(True, 1, RAN, {"outage_not_reviewed": 1, "outage_settled": 1}, id="a-job-to-review"),
        pytest.param(False, 2, RAN, {"outage_spent_no_attempt": 1}, id="an-attempt-spent"),
        pytest.param(False, 1, {**RAN, PHASE.outage_run: "success"}, {"outage_run_failed": 1}, id="run-not-failed"),
        pytest.param(False, 1, {PHASE.outage_run: "failed"}, {"outage_recovered": 1}, id="no-recovery-run"),
    ],
)
def test_each_way_the_outage_could_go_wrong_is_counted(
    store: JobStore, review_one: bool, attempts: int, ran: dict[str, str], broken: dict[str, int]
) -> None:
    finish(store, review_one=review_one, attempts=attempts)
    assert {k: v for k, v in violations(store, ran).items() if v} == broken


def test_the_models_own_doubt_after_the_outage_is_no_violation(store: JobStore) -> None:
    store.register(new_jobs(6), batch_key=PHASE.batch_key, step="classify", max_attempts=3)
    claim = store.claim(batch_key=PHASE.batch_key, step="classify", limit=10, lease_seconds=60, owner="t")
    store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive") for j in claim.jobs])
    assert set(violations(store, RAN).values()) == {0}


def test_no_job_of_the_date_is_a_violation(store: JobStore) -> None:
    assert violations(store, RAN)["outage_settled"] == 1
