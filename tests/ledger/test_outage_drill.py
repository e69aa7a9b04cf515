"""The outage phase of ``make chaos`` (:mod:`triage_tools.drill.outage`): its conf is a run a
``classify_documents`` run accepts, what it reads of reconciliation's decisions is what
reconciliation wrote, and its invariants judge a real ledger (no Airflow here;
``tests/drills/test_chaos.py`` runs the whole drill, with the resume forced while the model is down)."""

from __future__ import annotations

from datetime import date

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.contracts.run_config import ClassifyRunConfig
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, SendToReview
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage_tools.drill.outage import (
    OutagePhase,
    OutageRecord,
    outage_invariants,
    resume_decision,
    unfinished_and_parked,
)

PHASE = OutagePhase(date(2026, 9, 30), documents=6, seed=7)
OWNER = f"classify_documents/{PHASE.outage_run}/classify/0/try4"


class Runs:
    """Airflow's runs as reconciliation's outage rule asks them: the outage's run has failed."""

    def __init__(self, state: str = "failed") -> None:
        self._state = state

    def state(self, dag_id: str, run_id: str) -> str | None:
        return self._state if run_id == PHASE.outage_run else None

    def paused(self, dag_id: str) -> bool:
        return False


def test_the_outage_conf_is_the_llm_classifier_with_no_injected_fault() -> None:
    """The outage is the model's own (the drill's FakeModel is down), not the run's conf: a run
    resumed with the same conf meets the outage while it lasts and heals once it is over."""
    conf = ClassifyRunConfig.model_validate(PHASE.outage_conf())
    assert conf.classifier == "llm"
    assert not conf.drill.injects_faults
    assert (conf.documents, conf.drill.seed) == (6, 7)


def park(store: JobStore, due_in: float = 0.0) -> None:
    store.register(new_jobs(6), batch_key=PHASE.batch_key, step="classify", max_attempts=3)
    store.park_unstarted(
        PHASE.batch_key,
        "classify",
        dependency="model",
        delay_seconds=due_in,
        error_class="server_error",
        error="HTTP 503",
        actor=OWNER,
    )


def test_the_drill_reads_the_resume_reconciliation_planned(store: JobStore) -> None:
    park(store)
    with store.engine.connect() as conn:
        assert unfinished_and_parked(conn, PHASE)[:2] == (6, 6)
    reconcile(store, ReconcileParams(), runs=Runs("failed"), dag_run_id="chaos_reconcile_x")
    reconcile(store, ReconcileParams(), runs=Runs("running"), dag_run_id="chaos_reconcile_y")
    with store.engine.connect() as conn:
        assert resume_decision(conn, "chaos_reconcile_x", PHASE.batch_key)[0] == "resume"
        assert resume_decision(conn, "chaos_reconcile_y", PHASE.batch_key)[0] == "run_active"
        assert resume_decision(conn, "chaos_reconcile_z", PHASE.batch_key)[0] == "none"


def test_parked_jobs_not_yet_due_are_waited_for(store: JobStore) -> None:
    park(store, due_in=60.0)
    with store.engine.connect() as conn:
        unfinished, parked, due_in = unfinished_and_parked(conn, PHASE)
    assert (unfinished, parked) == (6, 6)
    assert 50.0 < due_in <= 60.0


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


def resumed(store: JobStore, times: int) -> None:
    """The date's six jobs parked, ``times`` reconciliations that planned the resume of the
    outage's run, and the jobs queued again as the resumed run's classify queues them."""
    park(store)
    for n in range(times):
        reconcile(store, ReconcileParams(), runs=Runs(), dag_run_id=f"chaos_reconcile_{n}")
    assert store.resume_parked(PHASE.batch_key, "classify", actor=OWNER)[0] == 6


def healed() -> OutageRecord:
    return OutageRecord(forced=1, first_state="failed", while_down=["failed"], healed_by=["chaos_reconcile_1"])


def violations(store: JobStore, record: OutageRecord, final: str | None = "success") -> dict[str, int]:
    with store.engine.connect() as conn:
        return {i.name: i.violations for i in outage_invariants(conn, PHASE, record, final)}


def test_a_healed_outage_breaks_nothing(store: JobStore) -> None:
    resumed(store, 2)
    finish(store)
    found = violations(store, healed())
    assert "outage_resumed_while_down" in found
    assert set(found.values()) == {0}


def test_without_a_forced_resume_there_is_no_such_invariant(store: JobStore) -> None:
    resumed(store, 1)
    finish(store)
    found = violations(store, OutageRecord(first_state="failed"))
    assert "outage_resumed_while_down" not in found
    assert set(found.values()) == {0}


@pytest.mark.parametrize(
    ("review_one", "attempts", "record", "final", "resumes", "broken"),
    [
        pytest.param(
            True, 1, healed(), "success", 2, {"outage_not_reviewed": 1, "outage_settled": 1}, id="a-job-to-review"
        ),
        pytest.param(False, 2, healed(), "success", 2, {"outage_spent_no_attempt": 1}, id="an-attempt-spent"),
        pytest.param(
            False,
            1,
            OutageRecord(forced=1, first_state="success", while_down=["failed"]),
            "success",
            2,
            {"outage_run_failed": 1},
            id="run-not-failed",
        ),
        pytest.param(
            False,
            1,
            OutageRecord(forced=1, first_state="failed", while_down=["success"]),
            "success",
            2,
            {"outage_resumed_while_down": 1},
            id="resumed-while-down-but-succeeded",
        ),
        pytest.param(
            False,
            1,
            OutageRecord(forced=2, first_state="failed", while_down=["failed"]),
            "success",
            3,
            {"outage_resumed_while_down": 1},
            id="a-forced-resume-missing",
        ),
        pytest.param(False, 1, healed(), "failed", 2, {"outage_healed_by_reconciliation": 1}, id="run-still-failed"),
        pytest.param(
            False,
            1,
            OutageRecord(forced=1, first_state="failed", while_down=["failed"], cleared_by_hand=True),
            "success",
            2,
            {"outage_healed_by_reconciliation": 1},
            id="cleared-by-hand",
        ),
        pytest.param(
            False, 1, healed(), "success", 1, {"outage_healed_by_reconciliation": 1}, id="no-resume-once-back"
        ),
    ],
)
def test_each_way_the_outage_could_go_wrong_is_counted(
    store: JobStore,
    review_one: bool,
    attempts: int,
    record: OutageRecord,
    final: str,
    resumes: int,
    broken: dict[str, int],
) -> None:
    resumed(store, resumes)
    finish(store, review_one=review_one, attempts=attempts)
    assert {k: v for k, v in violations(store, record, final).items() if v} == broken


def test_the_models_own_doubt_after_the_outage_is_no_violation(store: JobStore) -> None:
    resumed(store, 2)
    claim = store.claim(batch_key=PHASE.batch_key, step="classify", limit=10, lease_seconds=60, owner="t")
    store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive") for j in claim.jobs])
    assert set(violations(store, healed()).values()) == {0}


def test_no_job_of_the_date_is_a_violation(store: JobStore) -> None:
    assert violations(store, healed())["outage_settled"] == 1
