"""The backstop that needs no Airflow API (``orphaned_work``): the claimable jobs of a batch
nobody has worked on for ``orphan_seconds`` go to review as ``orphaned``, through the state
machine, with the reason logged; a batch with any sign of a live run is never touched."""

from __future__ import annotations

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from tests.ledger.test_reconcile_rules import q, sql
from triage.alerts import ORPHAN_REPAIRS, orphans_of
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite
from triage.reconciliation import rules
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

DEAD, LIVE, PARKED = "dead-batch", "live-batch", "parked-batch"
HOURS_13 = "interval '13 hours'"


def batch(store: JobStore, key: str, n: int = 4) -> None:
    """``n`` jobs: one completed, one retryable_failed (its lease expired), the rest queued."""
    store.register(new_jobs(n, prefix=key), batch_key=key, step="classify", max_attempts=3)
    done = store.claim(batch_key=key, step="classify", limit=1, lease_seconds=60, owner=f"{key}/w")
    store.record(done, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "keyword-v1")) for j in done.jobs])
    store.claim(batch_key=key, step="classify", limit=1, lease_seconds=60, owner=f"{key}/w")
    sql(
        store,
        "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running' AND batch_key = :b",
        b=key,
    )
    store.release_expired_leases(batch_key=key)


def age(store: JobStore, key: str) -> None:
    """The batch's last write, and its retryable job's due time, 13 hours ago."""
    sql(
        store,
        f"UPDATE triage.jobs SET updated_at = now() - {HOURS_13},"
        f" next_attempt_at = CASE WHEN status = 'retryable_failed' THEN now() - {HOURS_13} END"
        " WHERE batch_key = :b",
        b=key,
    )


def states(store: JobStore, key: str) -> dict[str, int]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT status::text, count(*) FROM triage.jobs WHERE batch_key = :b GROUP BY 1"), {"b": key}
        ).all()
    return {s: n for s, n in rows}


def test_a_dead_runs_jobs_go_to_review_as_orphaned_and_live_batches_are_left_alone(store: JobStore) -> None:
    for key in (DEAD, LIVE, PARKED):
        batch(store, key)
        age(store, key)
    # A live run: one of its jobs moved a minute ago (a claim, a heartbeat, a completion).
    sql(
        store,
        "UPDATE triage.jobs SET updated_at = now() - interval '1 minute' WHERE batch_key = :b AND status = 'completed'",
        b=LIVE,
    )
    # A batch parked on a dependency (waiting): its run comes back for it.
    store.claim(batch_key=PARKED, step="classify", limit=1, lease_seconds=60, owner=f"{PARKED}/w")
    sql(
        store,
        "UPDATE triage.jobs SET status = 'waiting', lease_owner = NULL, lease_token = NULL,"
        " lease_expires_at = NULL WHERE batch_key = :b AND status = 'running'",
        b=PARKED,
    )
    age(store, PARKED)
    before = {key: states(store, key) for key in (LIVE, PARKED)}

    dry = rules.orphaned_work(store, ReconcileParams(dry_run=True))
    assert [(f.check, f.count, f.repair) for f in dry.findings] == [("orphaned", 3, "orphans_sent_to_review")]
    assert dry.repairs == ()
    assert states(store, DEAD) == {"completed": 1, "retryable_failed": 1, "queued": 2}

    outcome = reconcile(store, ReconcileParams())  # no Airflow API at all
    assert outcome.summary["totals"]["skipped"]["airflow_view"]
    repairs = [r for r in outcome.summary["repairs"] if r["action"] == "orphans_sent_to_review"]
    assert [(r["rule"], r["count"]) for r in repairs] == [("orphaned_work", 3)]
    assert orphans_of(outcome.summary["repairs"]) == {"orphans_sent_to_review": 3}
    assert "orphans_sent_to_review" in ORPHAN_REPAIRS
    assert states(store, DEAD) == {"completed": 1, "manual_review": 3}
    assert {key: states(store, key) for key in (LIVE, PARKED)} == before
    # Each move went through the state machine, logged with its reason and actor, and has its
    # open review row with the reason a reviewer (and replay by reason) filters on.
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
            " WHERE j.batch_key = :b AND e.to_status = 'manual_review' AND e.reason = 'orphaned'"
            " AND e.actor = 'reconciliation' AND e.from_status IN ('queued', 'retryable_failed')",
            b=DEAD,
        )
        == 3
    )
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
            " WHERE j.batch_key = :b AND r.resolved_at IS NULL AND r.reason = 'orphaned'"
            " AND r.context ->> 'repaired_by' = 'reconciliation'",
            b=DEAD,
        )
        == 3
    )

    again = reconcile(store, ReconcileParams())
    assert not [r for r in again.summary["repairs"] if r["action"] == "orphans_sent_to_review"]
    assert q(store, "SELECT count(*) FROM triage.manual_review WHERE reason = 'orphaned'") == 3


def test_a_batch_within_the_threshold_or_holding_a_lease_is_not_orphaned(store: JobStore) -> None:
    batch(store, DEAD)
    age(store, DEAD)
    # A lease, even an expired one, is a run's: the lease rule takes it back first, and that
    # release is progress.
    store.claim(batch_key=DEAD, step="classify", limit=1, lease_seconds=60, owner="late/w")
    sql(store, f"UPDATE triage.jobs SET updated_at = now() - {HOURS_13} WHERE batch_key = :b", b=DEAD)
    assert rules.orphaned_work(store, ReconcileParams()).repairs == ()
    assert states(store, DEAD)["running"] == 1
    # Within the threshold (14 hours here) nothing is orphaned either.
    sql(
        store,
        "UPDATE triage.jobs SET status = 'queued', lease_owner = NULL, lease_token = NULL,"
        " lease_expires_at = NULL, updated_at = now() - interval '13 hours' WHERE status = 'running'",
    )
    assert rules.orphaned_work(store, ReconcileParams(orphan_seconds=14 * 3600)).findings == ()
    assert rules.orphaned_work(store, ReconcileParams(orphan_seconds=12 * 3600)).repairs != ()
