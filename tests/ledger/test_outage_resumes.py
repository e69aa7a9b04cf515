"""Work parked on an outage finishes by itself (issue #13, item 3): reconciliation plans to clear
the failed run that parked a batch once every parked job of it is due, and only then; the plan
is what ``reconcile_jobs``' mapped resume task clears. Real PostgreSQL; Airflow's runs are a
seam (:class:`Runs`), as the Task SDK answers them inside Airflow (tests/e2e has the real one)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.openai_server import FakeOpenAIServer, Reply
from tests.ledger.helpers import new_jobs
from tests.ledger.test_outage import BATCH, RUN, Switch, classify, counts, llm, register, reviews
from triage.jobs.sql.moves.outages import MAX_OUTAGE_BACKOFF_SECONDS
from triage.jobs.store import JobStore
from triage.operators.outage_resume import resume_requests
from triage.payloads import PayloadStore
from triage.pipeline.steps import CircuitOpen
from triage.reconciliation.outage_resumes import outage_resumes, planned_resumes
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile

DAG = "classify_documents"
OTHER = "2026-11-06T00:00:00+00:00/2026-11-07T00:00:00+00:00"


def owner(run_id: str, try_number: int = 1) -> str:
    return f"{DAG}/{run_id}/classify/0/try{try_number}"


@dataclass
class Runs:
    """Airflow's DAG runs, as the rule asks them: ``(dag, run) -> state``; absent: no such run."""

    states: dict[tuple[str, str], str] = field(default_factory=dict)
    paused_dags: set[str] = field(default_factory=set)
    asked: list[tuple[str, str]] = field(default_factory=list)

    def state(self, dag_id: str, run_id: str) -> str | None:
        self.asked.append((dag_id, run_id))
        return self.states.get((dag_id, run_id))

    def paused(self, dag_id: str) -> bool:
        return dag_id in self.paused_dags


def park(store: JobStore, batch_key: str, n: int, *, by: str, due_in: float = 0.0, prefix: str = "p") -> None:
    """``n`` jobs of ``batch_key`` registered and parked on a model outage by ``by``, due in ``due_in`` s."""
    store.register(new_jobs(n, prefix=prefix), batch_key=batch_key, step="classify", max_attempts=3)
    parked = store.park_unstarted(
        batch_key,
        "classify",
        dependency="model",
        delay_seconds=due_in,
        error_class="server_error",
        error="HTTP 503",
        actor=by,
    )
    assert parked == n


def decisions(result: Any) -> dict[str, str]:
    return {f.data["batch_key"]: f.data["decision"] for f in result.findings}


def test_a_batch_all_due_whose_run_failed_is_planned_once(store: JobStore) -> None:
    park(store, BATCH, 5, by=owner(RUN))
    runs = Runs({(DAG, RUN): "failed"})
    result = outage_resumes(store, ReconcileParams(), runs)
    assert decisions(result) == {BATCH: "resume"}
    (finding,) = result.findings
    assert (finding.count, finding.repair, finding.data["run_id"], finding.data["dag_id"]) == (
        5,
        "resume_outage_run",
        RUN,
        DAG,
    )
    assert len(finding.job_ids) == 5
    assert [(r.action, r.count) for r in result.repairs] == [("outage_resume_requested", 5)]
    assert result.conflicts == ()
    summary = {"rules": [result.as_dict()]}
    assert planned_resumes(summary) == [{"dag_id": DAG, "run_id": RUN, "batch_key": BATCH, "parked": 5}]
    assert resume_requests(summary) == [
        {
            "trigger_dag_id": DAG,
            "trigger_run_id": RUN,
            "logical_date": "2026-11-06T00:00:00+00:00",
            "batch_key": BATCH,
            "parked": 5,
        }
    ]


@pytest.mark.parametrize(
    ("runs", "due_in", "params", "decision", "conflict"),
    [
        pytest.param(Runs({(DAG, RUN): "failed"}), 600.0, ReconcileParams(), "not_due", False, id="not-due"),
        pytest.param(Runs({(DAG, RUN): "running"}), 0.0, ReconcileParams(), "run_active", False, id="run-running"),
        pytest.param(Runs({(DAG, RUN): "queued"}), 0.0, ReconcileParams(), "run_active", False, id="run-queued"),
        pytest.param(Runs({(DAG, RUN): "failed"}, {DAG}), 0.0, ReconcileParams(), "paused", False, id="paused"),
        pytest.param(Runs(), 0.0, ReconcileParams(), "run_missing", True, id="run-gone"),
        pytest.param(
            Runs({(DAG, RUN): "failed"}), 0.0, ReconcileParams(dry_run=True), "would_resume", False, id="dry-run"
        ),
        pytest.param(
            Runs({(DAG, RUN): "failed"}),
            0.0,
            ReconcileParams(max_outage_resumes=0),
            "over_limit",
            False,
            id="no-resumes-allowed",
        ),
        pytest.param(None, 0.0, ReconcileParams(), "no_airflow", False, id="outside-airflow"),
    ],
)
def test_a_parked_batch_is_left_alone_unless_certain(
    store: JobStore,
    runs: Runs | None,
    due_in: float,
    params: ReconcileParams,
    decision: str,
    conflict: bool,
) -> None:
    park(store, BATCH, 3, by=owner(RUN), due_in=due_in)
    result = outage_resumes(store, params, runs)
    assert decisions(result) == {BATCH: decision}
    assert result.repairs == ()
    assert planned_resumes({"rules": [result.as_dict()]}) == []
    assert [c.check for c in result.conflicts] == (["outage_unresumable"] if conflict else [])
    assert (result.skipped is not None) == (runs is None)
    if decision == "not_due":
        assert 590 <= result.findings[0].data["due_in_seconds"] <= 600
        assert runs is not None
        assert runs.asked == []  # Airflow is not asked about a batch that is not due


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_live_lease_or_another_active_run_of_the_batch_holds_it(store: JobStore) -> None:
    park(store, BATCH, 3, by=owner(RUN))
    # A second run of the date claimed a job it registered: its lease is live.
    store.register(new_jobs(1, prefix="late"), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner=owner("manual__again"))
    assert len(claim.jobs) == 1
    runs = Runs({(DAG, RUN): "failed", (DAG, "manual__again"): "running"})
    assert decisions(outage_resumes(store, ReconcileParams(), runs)) == {BATCH: "leased"}
    # Its retry takes the lease back (retryable again, moved last by that run, still running).
    released = store.release_expired_leases(
        actor=owner("manual__again", 2),
        earlier_tries_of=f"{DAG}/manual__again/classify/0/",
        owner=owner("manual__again", 2),
    )
    assert released.retrying == 1
    result = outage_resumes(store, ReconcileParams(), runs)
    assert decisions(result) == {BATCH: "run_active"}
    assert "manual__again" in result.findings[0].detail
    runs.states[(DAG, "manual__again")] = "failed"
    assert decisions(outage_resumes(store, ReconcileParams(), runs)) == {BATCH: "resume"}


def test_work_parked_by_anything_but_a_classify_documents_task_is_a_conflict(store: JobStore) -> None:
    park(store, BATCH, 2, by="a-script")
    result = outage_resumes(store, ReconcileParams(), Runs({(DAG, RUN): "failed"}))
    assert decisions(result) == {BATCH: "not_a_run"}
    assert [c.check for c in result.conflicts] == ["outage_unresumable"]


def test_the_soonest_due_batches_first_and_no_more_than_allowed(store: JobStore) -> None:
    park(store, BATCH, 2, by=owner(RUN), prefix="a")
    park(store, OTHER, 4, by=owner("scheduled__other"), prefix="b")
    with store.transaction("test") as conn:  # OTHER's jobs came due earlier
        conn.execute(
            sa.text("UPDATE triage.jobs SET next_attempt_at = now() - interval '1 h' WHERE batch_key = :b"),
            {"b": OTHER},
        )
    runs = Runs({(DAG, RUN): "failed", (DAG, "scheduled__other"): "failed"})
    result = outage_resumes(store, ReconcileParams(max_outage_resumes=1), runs)
    assert decisions(result) == {OTHER: "resume", BATCH: "over_limit"}
    assert [r["run_id"] for r in planned_resumes({"rules": [result.as_dict()]})] == ["scheduled__other"]


def test_the_run_that_parked_the_batch_last_is_the_one_resumed(store: JobStore) -> None:
    park(store, BATCH, 2, by=owner("scheduled__first"), prefix="a")
    park(store, BATCH, 2, by=owner("manual__second"), prefix="b")
    runs = Runs({(DAG, "scheduled__first"): "failed", (DAG, "manual__second"): "failed"})
    result = outage_resumes(store, ReconcileParams(), runs)
    assert [(f.count, f.data["run_id"], f.data["decision"]) for f in result.findings] == [
        (4, "manual__second", "resume")
    ]


@pytest.mark.own_database  # reconciliation needs commits and time (rows' age, the relay)
def test_a_real_outage_is_planned_once_due_and_the_cleared_run_finishes_the_day(
    store: JobStore, tmp_path: Path
) -> None:
    """The whole loop on the ledger: a try of RUN parks the batch on a 503 with Retry-After 60 s;
    reconciliation (the report, the JSON summary) plans nothing before the jobs are due and
    clears RUN once they are; the cleared run's next try, with the model back, completes every
    job on its first attempt; the next reconciliation plans nothing. The minute passes in the
    ledger (the parked jobs' due time moved back), not on the clock: with Retry-After 1 s and a
    sleep, a loaded machine reconciled "early" after the jobs were already due."""
    payloads = PayloadStore(tmp_path / "payloads")
    switch = Switch(Reply.status_only(503, retry_after="60"))
    with FakeOpenAIServer(responder=switch) as fake:
        register(store, payloads, 30, llm(fake).version)
        with pytest.raises(CircuitOpen):
            classify(store, llm(fake), payloads, try_number=1)
        runs = Runs({(DAG, RUN): "failed"})
        early = reconcile(store, ReconcileParams(grace_seconds=0), runs=runs)
        assert planned_resumes(early.summary) == []
        assert "outage_resumes" in early.summary["totals"]["checked"]
        with store.engine.begin() as conn:  # a minute later
            moved = conn.execute(
                sa.text(
                    "UPDATE triage.jobs SET next_attempt_at = next_attempt_at - interval '60 seconds'"
                    " WHERE status = 'waiting'"
                )
            ).rowcount
        assert moved == 30
        due = reconcile(store, ReconcileParams(grace_seconds=0), runs=runs)
        assert planned_resumes(due.summary) == [{"dag_id": DAG, "run_id": RUN, "batch_key": BATCH, "parked": 30}]
        assert "outage_resume_requested" in due.markdown
        assert {r["action"]: r["count"] for r in due.summary["repairs"]}["outage_resume_requested"] == 30
        switch.down = None
        classify(store, llm(fake), payloads, try_number=5)  # the cleared run's try
    assert counts(store, "SELECT status, attempt, count(*) FROM triage.jobs GROUP BY 1, 2") == {("completed", 1): 30}
    assert reviews(store) == 0
    after = reconcile(store, ReconcileParams(grace_seconds=0), runs=runs)
    assert next(r for r in after.summary["rules"] if r["rule"] == "outage_resumes")["findings"] == []


def due_in(store: JobStore) -> list[float]:
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.text("SELECT extract(epoch FROM next_attempt_at - now()) FROM triage.jobs ORDER BY id")
        ).scalars()
        return [float(r) for r in rows]


def test_a_dependency_still_down_is_tried_less_and_less_often(store: JobStore) -> None:
    """Each resume that finds the dependency down parks the jobs again: without a Retry-After
    their due time doubles (30 s, 1 min, 2 min, … at most an hour), so the resumes reconciliation
    plans (only once all are due) thin out; the model's own Retry-After is taken as it is."""
    store.register(new_jobs(3), batch_key=BATCH, step="classify", max_attempts=3)
    waits = []
    for _ in range(9):
        parked = store.park_unstarted(
            BATCH,
            "classify",
            dependency="model",
            delay_seconds=30,
            error_class="timeout",
            error="t",
            actor=owner(RUN),
            backoff=True,
        )
        assert parked == 3
        waits.append(max(due_in(store)))
        assert decisions(outage_resumes(store, ReconcileParams(), Runs({(DAG, RUN): "failed"}))) == {BATCH: "not_due"}
        with store.transaction("test") as conn:
            conn.execute(sa.text("UPDATE triage.jobs SET next_attempt_at = now() WHERE status = 'waiting'"))
        assert store.resume_parked(BATCH, "classify", actor=owner(RUN, 2)) == (3, None)
    expected = [min(30 * 2**i, MAX_OUTAGE_BACKOFF_SECONDS) for i in range(9)]
    assert [round(w) for w in waits] == pytest.approx(expected, abs=2)
    assert expected[-1] == MAX_OUTAGE_BACKOFF_SECONDS
    store.park_unstarted(
        BATCH,
        "classify",
        dependency="model",
        delay_seconds=2,
        error_class="server_error",
        error="503",
        actor=owner(RUN),
    )
    assert max(due_in(store)) <= 2  # a Retry-After is not grown


# -- intake's batch (issue #25, finding 4) ----------------------------------------------------------

INTAKE = "classify_intake"
INTAKE_RUN = "asset_triggered__2026-12-01T09:00:00+00:00"


def test_intake_work_parked_by_a_classify_intake_run_is_resumed_by_clearing_that_run(store: JobStore) -> None:
    """``classify_intake`` parks the ``intake`` batch as ``classify_documents`` parks a day's; a
    batch without a date is resumed by clearing the run that parked it (any run of the DAG takes
    the whole batch), not reported as "run the date again"."""
    park(store, "intake", 4, by=f"{INTAKE}/{INTAKE_RUN}/classify/1/try3")
    result = outage_resumes(store, ReconcileParams(), Runs({(INTAKE, INTAKE_RUN): "failed"}))
    assert decisions(result) == {"intake": "resume"}
    assert result.conflicts == ()
    assert resume_requests({"rules": [result.as_dict()]}) == [
        {
            "trigger_dag_id": INTAKE,
            "trigger_run_id": INTAKE_RUN,
            "logical_date": None,  # an asset-triggered run has none; the run is cleared by its id
            "batch_key": "intake",
            "parked": 4,
        }
    ]


@pytest.mark.parametrize(
    ("runs", "decision", "says"),
    [
        pytest.param(Runs({(INTAKE, INTAKE_RUN): "running"}), "run_active", "takes them up", id="run-running"),
        pytest.param(Runs({(INTAKE, INTAKE_RUN): "failed"}, {INTAKE}), "paused", "unpause it", id="paused"),
        pytest.param(Runs(), "run_missing", f"trigger {INTAKE}", id="run-gone"),
    ],
)
def test_parked_intake_work_says_what_to_do_when_it_cannot_be_resumed(
    store: JobStore, runs: Runs, decision: str, says: str
) -> None:
    park(store, "intake", 2, by=f"{INTAKE}/{INTAKE_RUN}/classify/0/try1")
    (finding,) = outage_resumes(store, ReconcileParams(), runs).findings
    assert finding.data["decision"] == decision
    assert says in finding.detail
    assert "date" not in finding.detail


def test_intake_work_parked_by_a_script_is_a_conflict_that_names_the_dag(store: JobStore) -> None:
    park(store, "intake", 2, by="a-script")
    result = outage_resumes(store, ReconcileParams(), Runs())
    assert decisions(result) == {"intake": "not_a_run"}
    assert f"trigger {INTAKE}" in result.findings[0].detail
