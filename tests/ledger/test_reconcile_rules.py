"""Each reconciliation rule against a real database with crafted states: what it finds, what
it repairs (through allowed transitions only), what it leaves to a human, and that a dry run
changes nothing and a second run repairs nothing."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import insert_job, job_in, move, new_jobs
from triage.contracts.events import WorkEvent
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite
from triage.jobs.vocabulary.states import JobStatus
from triage.reconciliation import rules
from triage.reconciliation.findings import RuleResult
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
NOW = ReconcileParams(
    grace_seconds=0,
    received_seconds=0,
    queued_seconds=0,
    retryable_seconds=0,
    waiting_seconds=0,
    running_seconds=0,
    outbox_age_seconds=0,
)
"""Every threshold at zero: anything crafted counts as stuck at once."""


def q(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).scalar()


def one(store: JobStore, sql: str, **params: object) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(sa.text(sql), params).one()


def sql(store: JobStore, statement: str, **params: object) -> None:
    with store.engine.begin() as conn:
        conn.execute(sa.text(statement), params)


def status(store: JobStore, job_id: uuid.UUID) -> str:
    return str(q(store, "SELECT status FROM triage.jobs WHERE id = :id", id=job_id))


def register(store: JobStore, n: int = 3, prefix: str = "doc") -> None:
    store.register(new_jobs(n, prefix=prefix), batch_key=BATCH, step="classify", max_attempts=3)


def claim(store: JobStore, limit: int = 10, lease: float = 60) -> Any:
    return store.claim(batch_key=BATCH, step="classify", limit=limit, lease_seconds=lease, owner="worker-1")


def expire_leases(store: JobStore) -> None:
    sql(store, "UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")


def checks(result: RuleResult) -> dict[str, int]:
    return {f.check: f.count for f in result.findings}


def repaired(result: RuleResult) -> dict[str, int]:
    return {r.action: r.count for r in result.repairs}


def in_state(store: JobStore, state: JobStatus) -> uuid.UUID:
    with store.engine.begin() as conn:
        return job_in(conn, state)


def ledger_snapshot(store: JobStore) -> dict[str, Any]:
    """Everything a repair could change (the runs table aside)."""
    return {
        "jobs": q(
            store,
            "SELECT md5(string_agg(id::text || status || coalesce(status_reason, '') || attempt"
            " || coalesce(lease_owner, ''), ',' ORDER BY id)) FROM triage.jobs",
        ),
        "events": q(store, "SELECT count(*) FROM triage.job_events"),
        "outbox": q(
            store,
            "SELECT count(*) || '/' || count(*) FILTER (WHERE (txid, event_id) <= (SELECT txid, event_id FROM triage.outbox_watermark)) FROM triage.outbox",
        ),
        "reviews": q(store, "SELECT count(*) || '/' || count(resolved_at) FROM triage.manual_review"),
        "labels": q(store, "SELECT count(*) FROM triage.document_labels"),
    }


# -- expired leases -----------------------------------------------------------------------------


def test_expired_leases_go_back_to_retryable_failed(store: JobStore) -> None:
    register(store, 3)
    claim(store)
    expire_leases(store)
    dry = rules.expired_leases(store, ReconcileParams(dry_run=True))
    assert checks(dry) == {"lease_expired": 3}
    assert dry.repairs == ()
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'running'") == 3
    result = rules.expired_leases(store, ReconcileParams())
    assert repaired(result) == {"lease_released": 3}
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'retryable_failed' AND lease_rescues = 1") == 3
    assert (
        q(store, "SELECT count(*) FROM triage.job_events WHERE actor = 'reconciliation' AND reason = 'lease_expired'")
        == 3
    )


def test_a_live_lease_and_a_completed_job_are_never_touched(store: JobStore) -> None:
    register(store, 2)
    held = claim(store, limit=1)
    job = held.jobs[0]
    store.record(held, [Complete(job.id, job.attempt, LabelWrite("billing", 0.9, "keyword-v1"))])
    claim(store, limit=1)  # a live lease
    result = rules.expired_leases(store, ReconcileParams())
    assert result.findings == ()
    assert result.repairs == ()
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'running'") == 1
    assert status(store, job.id) == "completed"


def test_a_job_rescued_too_often_goes_to_review(store: JobStore) -> None:
    register(store, 1)
    claim(store)
    expire_leases(store)
    rules.expired_leases(store, ReconcileParams(max_rescues=5))
    sql(store, "UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'retryable_failed'")
    claim(store)
    expire_leases(store)
    result = rules.expired_leases(store, ReconcileParams(max_rescues=5))
    assert repaired(result) == {"lease_released_to_review": 1}
    # It died twice in a claim of its own: poison (isolation), whatever max_rescues allows.
    assert q(store, "SELECT reason FROM triage.manual_review WHERE resolved_at IS NULL") == "poison"
    assert q(store, "SELECT count(*) FROM triage.jobs WHERE status = 'manual_review'") == 1
    register(store, 1, prefix="spent")
    sql(store, "UPDATE triage.jobs SET lease_rescues = 2 WHERE status = 'queued'")
    claim(store)
    expire_leases(store)
    result = rules.expired_leases(store, ReconcileParams(max_rescues=2))
    assert repaired(result) == {"lease_released_to_review": 1}
    assert q(store, "SELECT count(*) FROM triage.manual_review WHERE reason = 'lease_expired_repeatedly'") == 1


# -- stuck work ---------------------------------------------------------------------------------


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_received_job_is_queued_with_its_registered_event(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.RECEIVED, batch_key=BATCH)
    assert q(store, "SELECT count(*) FROM triage.outbox WHERE job_id = :j", j=job) == 0
    result = rules.stuck_work(store, NOW)
    assert checks(result) == {"stuck_received": 1}
    assert repaired(result) == {"queued_received": 1}
    assert status(store, job) == "queued"
    assert (
        q(store, "SELECT count(*) FROM triage.outbox WHERE job_id = :j AND event_type = 'job.registered'", j=job) == 1
    )
    assert rules.stuck_work(store, NOW).repairs == ()


def test_a_received_job_within_its_threshold_is_left_alone(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.RECEIVED, batch_key=BATCH)
    result = rules.stuck_work(store, ReconcileParams(received_seconds=3600))
    assert result.findings == ()
    assert result.repairs == ()
    assert status(store, job) == "received"


@pytest.mark.parametrize(
    "state",
    [
        pytest.param(JobStatus.QUEUED, id="queued"),
        pytest.param(JobStatus.WAITING, id="waiting"),
        pytest.param(JobStatus.RETRYABLE_FAILED, id="retryable-due"),
        pytest.param(JobStatus.RUNNING, id="running-live-lease"),
    ],
)
@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_stuck_work_without_a_certain_repair_is_reported_only(store: JobStore, state: JobStatus) -> None:
    job = in_state(store, state)
    result = rules.stuck_work(store, NOW)
    assert checks(result) == {f"stuck_{state.value}": 1}
    assert result.findings[0].job_ids == (str(job),)
    assert result.findings[0].repair is None
    assert result.repairs == ()
    assert status(store, job) == state.value


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_retryable_job_with_every_attempt_spent_goes_to_review(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.QUEUED, batch_key=BATCH)
        for _ in range(3):  # max_attempts = 3
            move(conn, job, JobStatus.RUNNING)
            move(conn, job, JobStatus.RETRYABLE_FAILED)
    result = rules.stuck_work(store, ReconcileParams(grace_seconds=0))
    assert repaired(result) == {"exhausted_unclaimable": 1}
    assert status(store, job) == "manual_review"
    assert (
        q(store, "SELECT reason FROM triage.manual_review WHERE job_id = :j AND resolved_at IS NULL", j=job)
        == "retries_exhausted"
    )


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_the_state_repairs_are_transitions_that_log_why(store: JobStore) -> None:
    """A repair that moves a job goes through the state machine like any transition: its
    job_events row names the reconciliation and the reason."""
    with store.engine.begin() as conn:
        received = insert_job(conn, JobStatus.RECEIVED, batch_key=BATCH)
        spent = insert_job(conn, JobStatus.QUEUED, batch_key=BATCH)
        for _ in range(3):  # max_attempts = 3
            move(conn, spent, JobStatus.RUNNING)
            move(conn, spent, JobStatus.RETRYABLE_FAILED)
    assert store.queue_stuck_received(older_than_seconds=0) == [received]
    assert store.send_spent_retries_to_review(grace_seconds=0) == [spent]
    last = "SELECT to_status, actor, reason FROM triage.job_events WHERE job_id = :j ORDER BY id DESC LIMIT 1"
    assert tuple(one(store, last, j=received)) == ("queued", "reconciliation", "reconciliation_queued")
    assert tuple(one(store, last, j=spent)) == ("manual_review", "reconciliation", "retries_exhausted")
    assert store.queue_stuck_received(older_than_seconds=0) == []  # fenced: nothing left to move
    assert store.send_spent_retries_to_review(grace_seconds=0) == []


# -- outbox -------------------------------------------------------------------------------------


def age_outbox(store: JobStore, seconds: int = 3600) -> None:
    sql(store, "UPDATE triage.outbox SET created_at = now() - make_interval(secs => :s)", s=seconds)


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_old_unsent_events_are_republished_and_lag_is_reported(store: JobStore) -> None:
    register(store, 3)
    age_outbox(store)
    register(store, 2, prefix="fresh")
    sent: list[WorkEvent] = []
    result = rules.outbox(store, ReconcileParams(outbox_age_seconds=600), sent.extend)
    lag = result.findings[0]
    assert (lag.check, lag.count, lag.data["old"]) == ("outbox_lag", 5, 3)
    assert lag.data["oldest_seconds"] >= 3600
    assert repaired(result) == {"republished": 3}
    assert len(sent) == 3
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 2
    )  # the fresh ones wait


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_sink_that_is_down_degrades_to_a_finding(store: JobStore) -> None:
    register(store, 2)
    age_outbox(store)

    def down(events: Sequence[WorkEvent]) -> None:
        raise OSError("disk full")

    result = rules.outbox(store, ReconcileParams(outbox_age_seconds=60), down)
    assert checks(result) == {"outbox_lag": 2, "republish_failed": 2}
    assert result.repairs == ()
    assert (
        q(
            store,
            "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)",
        )
        == 2
    )


def test_a_dry_run_republishes_nothing(store: JobStore) -> None:
    register(store, 2)
    age_outbox(store)
    sent: list[WorkEvent] = []
    result = rules.outbox(store, ReconcileParams(dry_run=True, outbox_age_seconds=60), sent.extend)
    assert result.repairs == ()
    assert sent == []


# -- consistency --------------------------------------------------------------------------------


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_job_in_review_without_its_review_row_gets_one(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)  # ad hoc: no review row
    result = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert repaired(result) == {"insert_missing_review": 1}
    row = one(
        store,
        "SELECT reason, attempts, context FROM triage.manual_review WHERE job_id = :j AND resolved_at IS NULL",
        j=job,
    )
    assert row.reason == "reconciliation_missing_review"
    assert row.context["repaired_by"] == "reconciliation"
    assert rules.consistency(store, ReconcileParams(grace_seconds=0)).repairs == ()


def open_review(store: JobStore, job: uuid.UUID) -> None:
    sql(store, "INSERT INTO triage.manual_review (job_id, reason, attempts) VALUES (:j, 'inconclusive', 1)", j=job)


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_an_open_review_of_a_terminal_job_is_superseded(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)
    open_review(store, job)
    with store.engine.begin() as conn:
        move(conn, job, JobStatus.TERMINAL_FAILED)  # a reject that forgot to resolve its row
    result = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert repaired(result) == {"supersede_review": 1}
    assert q(store, "SELECT resolution FROM triage.manual_review WHERE job_id = :j", j=job) == "superseded"
    assert q(store, "SELECT resolved_by FROM triage.manual_review WHERE job_id = :j", j=job) == "reconciliation"
    assert status(store, job) == "terminal_failed"


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_an_open_review_of_a_job_back_in_the_queue_is_a_conflict(store: JobStore) -> None:
    with store.engine.begin() as conn:
        job = insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)
    open_review(store, job)
    with store.engine.begin() as conn:
        move(conn, job, JobStatus.QUEUED)
    result = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert result.repairs == ()
    assert [(c.check, c.job_ids) for c in result.conflicts] == [("review_open_for_active_job", (str(job),))]
    assert q(store, "SELECT count(*) FROM triage.manual_review WHERE resolved_at IS NULL") == 1


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_completed_job_without_its_event_gets_one_and_its_missing_label_is_a_conflict(store: JobStore) -> None:
    job = in_state(store, JobStatus.COMPLETED)  # ad hoc: no event, no label
    result = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert repaired(result) == {"append_completed_event": 1}
    assert q(store, "SELECT count(*) FROM triage.outbox WHERE job_id = :j AND event_type = 'job.completed'", j=job) == 1
    assert [c.check for c in result.conflicts] == ["completed_without_label"]
    assert q(store, "SELECT count(*) FROM triage.document_labels") == 0  # a label is never guessed
    again = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert again.repairs == ()
    assert [c.check for c in again.conflicts] == ["completed_without_label"]


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_label_whose_job_is_not_completed_is_a_conflict(store: JobStore) -> None:
    job = in_state(store, JobStatus.QUEUED)
    sql(
        store,
        "INSERT INTO triage.document_labels (source, external_id, label, classifier_version, content_sha256,"
        " job_id, job_created_at) VALUES ('s', 'x', 'billing', 'v', 'h', :j, now())",
        j=job,
    )
    result = rules.consistency(store, ReconcileParams(grace_seconds=0))
    assert [(c.check, c.job_ids) for c in result.conflicts] == [("label_without_completed_job", (str(job),))]


def test_a_label_written_by_a_newer_job_satisfies_an_older_completed_job(store: JobStore) -> None:
    register(store, 1)
    held = claim(store)
    job = held.jobs[0]
    store.record(held, [Complete(job.id, job.attempt, LabelWrite("billing", 0.9, "keyword-v1"))])
    assert rules.consistency(store, ReconcileParams(grace_seconds=0)).findings == ()


def test_the_grace_period_leaves_fresh_changes_alone(store: JobStore) -> None:
    with store.engine.begin() as conn:
        insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)
    assert rules.consistency(store, ReconcileParams(grace_seconds=3600)).findings == ()


# -- whole runs ---------------------------------------------------------------------------------


def craft_everything(store: JobStore) -> None:
    """One case for every rule."""
    register(store, 2)
    claim(store, limit=1)
    expire_leases(store)
    age_outbox(store)
    with store.engine.begin() as conn:
        insert_job(conn, JobStatus.RECEIVED, batch_key=BATCH)
        insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)
        job_in(conn, JobStatus.COMPLETED)


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_dry_run_changes_nothing_but_records_itself(store: JobStore) -> None:
    craft_everything(store)
    before = ledger_snapshot(store)
    sent: list[WorkEvent] = []
    outcome = reconcile(store, NOW.model_copy(update={"dry_run": True}), publish=sent.extend)
    assert ledger_snapshot(store) == before
    assert sent == []
    assert outcome.summary["repairs"] == []
    found = {f["check"] for r in outcome.summary["rules"] for f in r["findings"]}
    assert {"lease_expired", "stuck_received", "outbox_lag", "review_row_missing", "completed_without_event"} <= found
    row = one(store, "SELECT dry_run, finished_at, repairs FROM triage.reconciliation_runs")
    assert row.dry_run is True
    assert row.finished_at is not None
    assert row.repairs == []


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_second_run_repairs_nothing(store: JobStore) -> None:
    craft_everything(store)
    sent: list[WorkEvent] = []
    first = reconcile(store, NOW, publish=sent.extend)
    actions = {r["action"] for r in first.summary["repairs"]}
    assert {
        "lease_released",
        "queued_received",
        "republished",
        "insert_missing_review",
        "append_completed_event",
    } <= actions
    before = ledger_snapshot(store)
    second = reconcile(store, NOW.model_copy(update={"outbox_age_seconds": 3600}), publish=sent.extend)
    assert second.summary["repairs"] == []
    assert ledger_snapshot(store) == before
    assert q(store, "SELECT count(*) FROM triage.reconciliation_runs WHERE finished_at IS NOT NULL") == 2


@pytest.mark.parametrize("check", ["completed_without_label", "label_without_completed_job"])
def test_the_label_checks_probe_per_row_and_never_hash_the_history(store: JobStore, check: str) -> None:
    """Issue #16, item 3: each label check probes the other table by its key for each row of the
    last day. Written as a plain NOT EXISTS, the planner turns it into an anti-join, and once a
    day's labels outnumber a few thousand it hashed the whole other table: at 1M jobs a parallel
    scan of every completed job ever (1.2 s), every 15 minutes. The plan must keep the probe a
    subplan (OFFSET 0), whatever the statistics say."""
    from triage.jobs.sql.reads import checks

    jobs = new_jobs(3)
    store.register(jobs, batch_key="b", step="classify", max_attempts=3)
    claim = store.claim(batch_key="b", step="classify", limit=3, lease_seconds=60, owner="w")
    store.record(claim, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v1")) for j in claim.jobs])
    statement = getattr(checks, check)()
    compiled = statement.compile(dialect=store.engine.dialect)
    with store.engine.connect() as conn:
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql("EXPLAIN " + str(compiled), compiled.construct_params({"grace": 0})).all()
        )
    assert "Anti Join" not in plan, plan
    assert "SubPlan" in plan, plan
