"""The order of the reconciliation rules, by what it does to jobs (not by a list of names): each
rule sees the repairs of the rules before it. Airflow's view runs after the lease rule, so that a
job its failed task held under an expired lease is first judged as the lease rule judges every
dead claim (its attempts spent: ``retries_exhausted``) and only what is left goes to review as
``airflow_task_failed``. Computed first (a regression fixed in 6b11124, when the view's skip
reason was handed to ``dead_last_tries``), the view took every one of them as the task's."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from tests.ledger.test_reconcile_airflow_view import BATCH, RUN, FakeAirflow, api, run, ti
from tests.ledger.test_reconcile_last_try import FINAL_TRY
from tests.ledger.test_reconcile_rules import sql
from triage.jobs.store import JobStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

OWNER = f"classify_documents/{RUN}/classify/-1/try{FINAL_TRY}"


def test_the_airflow_view_judges_only_what_the_lease_rule_left(store: JobStore) -> None:
    # Two jobs, each claimed alone by the failed task's final try, which was killed (its leases
    # ran out): one has no attempt left, the other has.
    [spent] = store.register(new_jobs(1, prefix="spent"), batch_key=BATCH, step="classify", max_attempts=1).new_ids
    [spare] = store.register(new_jobs(1, prefix="spare"), batch_key=BATCH, step="classify", max_attempts=3).new_ids
    for _ in range(2):
        store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner=OWNER)
    sql(store, "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")

    airflow = FakeAirflow([run()], [{**ti(), "try_number": FINAL_TRY}])
    outcome = reconcile(store, ReconcileParams(), api=api(airflow), final_try=FINAL_TRY)

    with store.engine.connect() as conn:
        reasons: dict[uuid.UUID, str] = dict(
            conn.execute(sa.text("SELECT job_id, reason FROM triage.manual_review WHERE resolved_at IS NULL"))
            .tuples()
            .all()
        )
    assert reasons == {spent: "retries_exhausted", spare: "airflow_task_failed"}
    done = {(r["rule"], r["action"]): r["count"] for r in outcome.summary["repairs"]}
    assert done == {
        ("expired_leases", "lease_released"): 1,
        ("expired_leases", "lease_released_to_review"): 1,
        ("airflow_view", "batch_sent_to_review"): 1,  # the view took only what the lease rule left
    }
