"""A task's final try killed while it held jobs, with no Airflow API to ask (``dead_last_tries``):
the lease rule gives the jobs back as ``retryable_failed``, and no retry of the task will ever
claim them. The ledger-only rule settles them (``manual_review``, ``airflow_task_failed``, the
rule and threshold in the review row and the report) once their batch has been idle past the
threshold, and never touches a batch whose dead try had retries left or that a live run writes."""

from __future__ import annotations

import socket
from typing import Any

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from tests.ledger.test_reconcile_rules import q, sql
from triage.adapters.airflow_api import AirflowApi
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite, RetryLater
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import RunOutcome, reconcile

FINAL_TRY = 4  # classify_documents' tasks: retries=3 (triage.operators.tasks.DEFAULT_ARGS)
KILLED_LAST, KILLED_EARLIER, LIVE = "killed-last-try", "killed-earlier-try", "live-sibling"


def owner(batch: str, try_number: int, map_index: int = 0) -> str:
    return f"classify_documents/manual__{batch}/classify/{map_index}/try{try_number}"


def killed(store: JobStore, batch: str, try_number: int) -> None:
    """Four jobs: one completed by try 1, two held by ``try_number`` when it was SIGKILLed (its
    lease ran out), one still queued."""
    store.register(new_jobs(4, prefix=batch), batch_key=batch, step="classify", max_attempts=3)
    done = store.claim(batch_key=batch, step="classify", limit=1, lease_seconds=60, owner=owner(batch, 1))
    store.record(done, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "keyword-v1")) for j in done.jobs])
    store.claim(batch_key=batch, step="classify", limit=2, lease_seconds=60, owner=owner(batch, try_number))
    sql(
        store,
        "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running' AND batch_key = :b",
        b=batch,
    )


def later(store: JobStore, interval: str) -> None:
    """Time passes: every job's timestamps move ``interval`` into the past."""
    sql(
        store,
        f"UPDATE triage.jobs SET created_at = created_at - interval '{interval}',"
        f" updated_at = updated_at - interval '{interval}',"
        f" next_attempt_at = next_attempt_at - interval '{interval}'",
    )


def states(store: JobStore, batch: str) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT status::text, count(*) FROM triage.jobs WHERE batch_key = :b GROUP BY 1"), {"b": batch}
        ).all()
    return {s: n for s, n in rows}


def unreachable_api() -> AirflowApi:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return AirflowApi(f"http://127.0.0.1:{port}", timeout_s=2)


def repairs_of(summary: dict[str, Any], action: str) -> list[dict[str, Any]]:
    return [r for r in summary["repairs"] if r["action"] == action]


def test_jobs_a_killed_final_try_held_are_settled_without_the_airflow_api(store: JobStore) -> None:
    killed(store, KILLED_LAST, FINAL_TRY)
    killed(store, KILLED_EARLIER, 2)  # Airflow retries this task: its next try claims the jobs
    killed(store, LIVE, FINAL_TRY)
    api = unreachable_api()

    # reconcile_jobs every 15 minutes would do this three times in half an hour; two hours apart
    # here, still far inside orphan_seconds (12 h), the backstop that settled them before.
    outcomes: list[RunOutcome] = []
    for _ in range(3):
        if outcomes:
            later(store, "2 hours")
            # A sibling map index of the live batch's run is still working: it just wrote.
            sql(
                store, "UPDATE triage.jobs SET updated_at = now() WHERE batch_key = :b AND status = 'completed'", b=LIVE
            )
        outcomes.append(reconcile(store, ReconcileParams(), api=api, final_try=FINAL_TRY))
        assert outcomes[-1].summary["totals"]["skipped"]["airflow_view"].startswith("Airflow's REST API is unavailable")

    assert states(store, KILLED_LAST) == {"completed": 1, "manual_review": 2, "queued": 1}
    assert states(store, KILLED_EARLIER) == {"completed": 1, "retryable_failed": 2, "queued": 1}
    assert states(store, LIVE) == {"completed": 1, "retryable_failed": 2, "queued": 1}

    # Settled once, by the second reconciliation (the batch idle for 2 h > last_try_seconds, 1 h).
    settled = [repairs_of(o.summary, "last_try_dead_to_review") for o in outcomes]
    assert [sum(r["count"] for r in found) for found in settled] == [0, 2, 0]
    [repair] = settled[1]
    assert repair["rule"] == "dead_last_tries"
    assert "Airflow API unreachable: ledger-only rule" in repair["detail"]
    assert "3600 s" in repair["detail"]
    assert f"try {FINAL_TRY}" in repair["detail"]
    [finding] = [f for r in outcomes[1].summary["rules"] if r["rule"] == "dead_last_tries" for f in r["findings"]]
    assert finding["data"]["threshold_seconds"] == 3600
    assert finding["data"]["final_try"] == FINAL_TRY
    assert finding["data"]["airflow_api"] == "unreachable"

    # Through the state machine, with the reason and the actor logged, and a review row that
    # says which rule moved the job and why.
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
            " WHERE j.batch_key = :b AND e.from_status = 'retryable_failed' AND e.to_status = 'manual_review'"
            " AND e.reason = 'airflow_task_failed' AND e.actor = 'reconciliation'",
            b=KILLED_LAST,
        )
        == 2
    )
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
            " WHERE j.batch_key = :b AND r.resolved_at IS NULL AND r.reason = 'airflow_task_failed'"
            " AND r.context ->> 'rule' = 'dead_last_tries' AND (r.context ->> 'final_try')::int = :final"
            " AND (r.context ->> 'threshold_seconds')::int = 3600"
            " AND r.context ->> 'holder' LIKE '%/try4'",
            b=KILLED_LAST,
            final=FINAL_TRY,
        )
        == 2
    )


def test_without_the_tasks_retries_known_the_rule_is_skipped(store: JobStore) -> None:
    killed(store, KILLED_LAST, FINAL_TRY)
    reconcile(store, ReconcileParams())
    later(store, "2 hours")
    outcome = reconcile(store, ReconcileParams())
    assert "final try" in outcome.summary["totals"]["skipped"]["dead_last_tries"]
    assert states(store, KILLED_LAST) == {"completed": 1, "retryable_failed": 2, "queued": 1}


def test_a_dry_run_reports_the_dead_last_try_and_moves_nothing(store: JobStore) -> None:
    killed(store, KILLED_LAST, FINAL_TRY)
    reconcile(store, ReconcileParams(), final_try=FINAL_TRY)  # the lease rule gives the jobs back
    later(store, "2 hours")
    outcome = reconcile(store, ReconcileParams(dry_run=True), final_try=FINAL_TRY)
    [rule] = [r for r in outcome.summary["rules"] if r["rule"] == "dead_last_tries"]
    assert [(f["check"], f["count"], f["repair"]) for f in rule["findings"]] == [
        ("last_try_dead", 2, "last_try_dead_to_review")
    ]
    assert rule["repairs"] == []
    assert "ledger-only rule" in rule["findings"][0]["detail"]
    assert states(store, KILLED_LAST) == {"completed": 1, "retryable_failed": 2, "queued": 1}


# -- what the rule must never take: work a live or coming run can still pick up ------------------


def expire_leases(store: JobStore, batch: str) -> None:
    sql(
        store,
        "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running' AND batch_key = :b",
        b=batch,
    )


def test_a_cleared_tasks_later_try_is_not_taken_for_a_final_one(store: JobStore) -> None:
    """A task cleared from the UI goes on counting: try 5, 6, 7 follow the final try 4, each with
    retries left, and the ledger cannot tell which of them will be the last. Refused (the orphan
    rule, or Airflow's view, settles them) rather than settled while a retry may come."""
    killed(store, "cleared", FINAL_TRY + 1)
    api = unreachable_api()
    reconcile(store, ReconcileParams(), api=api, final_try=FINAL_TRY)
    later(store, "2 hours")
    outcome = reconcile(store, ReconcileParams(), api=api, final_try=FINAL_TRY)
    assert repairs_of(outcome.summary, "last_try_dead_to_review") == []
    assert states(store, "cleared") == {"completed": 1, "retryable_failed": 2, "queued": 1}


def test_a_live_sibling_or_a_later_runs_claim_keeps_the_jobs(store: JobStore) -> None:
    """A sibling map index still holding a lease keeps the whole batch out (it will claim what is
    due); a job a later run (a backfill of the date) claimed after the dead final try is that
    run's, whatever its try number: only the job whose last holder was the final try moves."""
    killed(store, "mapped", FINAL_TRY)
    store.claim(batch_key="mapped", step="classify", limit=1, lease_seconds=86_400, owner=owner("mapped", 1, 1))
    killed(store, "backfilled", FINAL_TRY)
    reconcile(store, ReconcileParams(), final_try=FINAL_TRY)  # the dead try's leases given back
    backfill = "classify_documents/backfill__2026-11-05/classify/0/try1"
    taken = store.claim(batch_key="backfilled", step="classify", limit=1, lease_seconds=60, owner=backfill)
    assert [j.attempt for j in taken.jobs] == [2]  # one of the dead try's jobs
    store.record(taken, [RetryLater(j.id, j.attempt, "timeout", delay_seconds=0) for j in taken.jobs])
    reconcile(store, ReconcileParams(), final_try=FINAL_TRY)
    later(store, "2 hours")
    reconcile(store, ReconcileParams(), final_try=FINAL_TRY)
    assert states(store, "mapped") == {"completed": 1, "retryable_failed": 2, "running": 1}
    assert states(store, "backfilled") == {"completed": 1, "manual_review": 1, "retryable_failed": 1, "queued": 1}
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
            " WHERE j.batch_key = 'backfilled' AND r.context ->> 'holder' LIKE '%/try4'",
        )
        == 1
    )


def test_with_the_api_answering_a_queued_run_of_the_batch_keeps_the_jobs(store: JobStore) -> None:
    """Airflow's API answers: run A's final try died holding jobs, and a backfill of the same date
    (run B) is queued, waiting for a slot longer than the threshold. Airflow's view knows B will
    claim them and reports a conflict; the ledger-only rule must not settle them behind its back
    (it leaves ``classify_documents`` to the view whenever the API answers)."""
    from tests.ledger.test_reconcile_airflow_view import BATCH, RUN, FakeAirflow, run, ti
    from tests.ledger.test_reconcile_airflow_view import api as fake_api

    store.register(new_jobs(3, prefix="af"), batch_key=BATCH, step="classify", max_attempts=3)
    dead = f"classify_documents/{RUN}/classify/0/try{FINAL_TRY}"
    store.claim(batch_key=BATCH, step="classify", limit=2, lease_seconds=60, owner=dead)
    expire_leases(store, BATCH)
    airflow = FakeAirflow(
        [run(), run(run_id="backfill__2026-11-06T00:00:00+00:00", state="queued")],
        [{**ti(), "map_index": 0, "try_number": FINAL_TRY}],
    )
    reconcile(store, ReconcileParams(), api=fake_api(airflow), final_try=FINAL_TRY)
    later(store, "2 hours")
    outcome = reconcile(store, ReconcileParams(), api=fake_api(airflow), final_try=FINAL_TRY)
    assert [c["check"] for c in outcome.summary["conflicts"]] == ["task_failed_run_active"]
    assert repairs_of(outcome.summary, "last_try_dead_to_review") == []
    assert states(store, BATCH) == {"retryable_failed": 2, "queued": 1}
