"""The kill-on-the-last-try case of ``make chaos`` (:mod:`triage_tools.drill.last_try`): its conf
is a run ``classify_documents`` accepts, and its invariants judge a real ledger that
reconciliation's Airflow view settled (Airflow faked at the HTTP layer; ``tests/drills/test_chaos.py``
runs the whole drill, with a real Airflow and a real SIGKILL)."""

from __future__ import annotations

from datetime import date
from typing import Any

import httpx
import pytest

from tests.ledger.helpers import new_jobs
from tests.ledger.test_reconcile_airflow_view import FakeAirflow
from triage.adapters.airflow_api import AirflowApi
from triage.contracts.run_config import ClassifyRunConfig
from triage.jobs.store import JobStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage_tools.drill.last_try import LastTryKill, LastTryPhase, held_jobs, last_try_invariants

PHASE = LastTryPhase(date(2026, 9, 29), documents=6, seed=7)
OWNER = f"classify_documents/{PHASE.run_id}/classify/0/try4"


def test_the_conf_runs_the_llm_classifier_without_injected_faults() -> None:
    conf = ClassifyRunConfig.model_validate(PHASE.conf())
    assert conf.classifier == "llm"
    assert not conf.drill.injects_faults
    assert conf.documents == 6


def test_the_callback_actor_is_the_one_the_failure_callback_writes() -> None:
    kill = LastTryKill(OWNER, 4, 3, ())
    # triage.adapters.callbacks: actor=f"{owner_prefix}failure_callback", owner_prefix = dag/run/task/map_index/
    assert kill.callback_actor == f"classify_documents/{PHASE.run_id}/classify/0/failure_callback"


def airflow(state: str = "failed") -> AirflowApi:
    """Airflow's view after the kill: the task's last try failed, so did its run."""
    start, end = (f"{PHASE.day.isoformat()}T00:00:00Z", f"{date.fromordinal(PHASE.day.toordinal() + 1)}T00:00:00Z")
    runs = [{"dag_run_id": PHASE.run_id, "state": state, "data_interval_start": start, "data_interval_end": end}]
    tis = [{"dag_run_id": PHASE.run_id, "task_id": "classify", "map_index": 0, "state": "failed", "try_number": 4}]
    return AirflowApi("http://airflow.test", transport=httpx.MockTransport(FakeAirflow(runs, tis)))


def killed_on_last_try(store: JobStore, try_number: int = 4) -> LastTryKill:
    """Six jobs of the date, claimed by the last try of classify[0], whose process then died."""
    store.register(new_jobs(6, prefix="lt"), batch_key=PHASE.batch_key, step="classify", max_attempts=3)
    store.claim(batch_key=PHASE.batch_key, step="classify", limit=10, lease_seconds=300, owner=OWNER)
    with store.engine.connect() as conn:
        return LastTryKill(OWNER, try_number, 3, tuple(held_jobs(conn, OWNER)))


def violations(store: JobStore, kill: LastTryKill | None, run_state: str | None = "failed") -> dict[str, int]:
    with store.engine.connect() as conn:
        return {i.name: i.violations for i in last_try_invariants(conn, PHASE, kill, run_state)}


def reconciled(store: JobStore, api: AirflowApi | None) -> dict[str, Any]:
    params = ReconcileParams(grace_seconds=0, outbox_age_seconds=0)
    return reconcile(store, params, publish=lambda events: None, api=api).summary


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_the_cross_check_settles_what_the_killed_last_try_held(store: JobStore) -> None:
    kill = killed_on_last_try(store)
    assert len(kill.job_ids) == 6
    summary = reconciled(store, airflow())
    assert "airflow_view" not in summary["totals"]["skipped"]
    assert violations(store, kill) == dict.fromkeys(violations(store, kill), 0)


def test_without_the_airflow_view_the_jobs_are_left_and_the_invariants_say_so(store: JobStore) -> None:
    kill = killed_on_last_try(store)
    reconciled(store, None)
    found = violations(store, kill)
    assert found["last_try_nothing_left"] == 6  # a live lease: no other rule may take it
    assert found["last_try_settled_by_cross_check"] == 6


def test_a_failure_callback_that_ran_is_told_apart_from_the_cross_check(store: JobStore) -> None:
    kill = killed_on_last_try(store)
    store.send_batch_to_review(
        PHASE.batch_key,
        reason="airflow_task_failed",
        error="task failed",
        owner_prefix=OWNER.rsplit("/", 1)[0] + "/",
        actor=kill.callback_actor,
    )
    reconciled(store, airflow())
    found = violations(store, kill)
    assert found["last_try_no_callback"] == 6
    assert found["last_try_settled_by_cross_check"] == 6
    assert found["last_try_nothing_left"] == 0


@pytest.mark.parametrize(
    ("try_number", "run_state", "broken"),
    [
        pytest.param(3, "failed", "last_try_killed", id="killed-before-the-last-try"),
        pytest.param(4, "success", "last_try_run_failed", id="the-run-did-not-fail"),
    ],
)
@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_kill_that_was_not_on_the_last_try_or_a_run_that_went_on_is_caught(
    store: JobStore, try_number: int, run_state: str, broken: str
) -> None:
    kill = killed_on_last_try(store, try_number)
    reconciled(store, airflow())
    assert {k for k, v in violations(store, kill, run_state).items() if v} == {broken}


def test_no_kill_at_all_is_caught(store: JobStore) -> None:
    assert violations(store, None)["last_try_killed"] == 1
