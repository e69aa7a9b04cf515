"""Batch mode through a real scheduler and triggerer: ``airflow backfill create ... --dag-run-conf
'{"classifier": "llm", "model_mode": "batch", ...}'`` (what ``./airflow.sh backfill create`` does
under ``make up``, whose ``airflow standalone`` runs a triggerer) and a run triggered through the
REST API with the same conf (what the UI's trigger form posts).

Each run's ``size_classify`` submits its day to the fake server's batch interface, defers, and
the triggerer (not a worker) polls the provider until the batch is done; the scheduler then
resumes the task on a worker, which collects, and ``classify`` completes every job from the
batch's answers: no interactive call.

Owns ``classify_documents``' logical dates 2026-11-04, 2026-11-05 and 2026-11-10 (run id
``triggered``) and their batches (:data:`BATCH_DAYS`)."""

from __future__ import annotations

import contextlib
import json
import time

from tests.e2e.conftest import E2E
from tests.harness.airflow import HarnessError, task_states, wait_for_runs

DOCUMENTS = 40
CONF = {"classifier": "llm", "model_mode": "batch", "documents": DOCUMENTS}
DAYS = ("2026-11-04", "2026-11-05")
TRIGGERED = "2026-11-10"
# The batches these runs own, by their first day: a triggered run's data interval may end at its
# logical date (2026-11-09/10) or start there; no other test uses either day.
BATCH_DAYS = (*DAYS, "2026-11-09", TRIGGERED)


def wait_for_task_state(env: dict[str, str], run_id: str, task_id: str, wanted: str, timeout: float) -> list[str]:
    """The states ``task_id`` of the run went through until it was ``wanted`` (or finished)."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(HarnessError):  # the run may not be created yet
            state = task_states(env, "classify_documents", run_id).get(task_id)
            if state and (not seen or seen[-1] != state):
                seen.append(state)
            if state in (wanted, "success", "failed", "upstream_failed"):
                return seen
        time.sleep(0.5)
    return seen


def test_a_batch_mode_backfill_and_a_triggered_run_wait_in_the_triggerer(e2e: E2E) -> None:
    model = e2e.model
    model.batches.polls_until_done = 10  # the task's first look, then ~9 s of the triggerer's polls
    created, calls = model.batches.created, model.request_count
    e2e.cli("dags", "unpause", "classify_documents")
    e2e.backfill("classify_documents", DAYS[0], DAYS[-1], "--dag-run-conf", json.dumps(CONF))
    e2e.airflow.post(
        "/api/v2/dags/classify_documents/dagRuns",
        {"dag_run_id": "triggered", "logical_date": f"{TRIGGERED}T00:00:00Z", "conf": CONF},
    )
    seen = wait_for_task_state(e2e.env, "triggered", "size_classify", "deferred", timeout=300)
    backfill = wait_for_runs(
        e2e.env,
        "classify_documents",
        2,
        ("success",),
        timeout=600,
        run_type="backfill",
        where=lambda run: str(run["logical_date"])[:10] in DAYS,
    )
    triggered = wait_for_runs(
        e2e.env, "classify_documents", 1, ("success",), timeout=300, where=lambda run: run["run_id"] == "triggered"
    )
    states = task_states(e2e.env, "classify_documents", "triggered")

    assert "deferred" in seen  # the wait ran in the triggerer, no worker slot held
    assert [r["state"] for r in backfill + triggered] == ["success"] * 3
    assert states["size_classify"] == "success", states
    assert model.batches.created - created == 3  # one provider batch a run
    assert model.request_count == calls  # no interactive call
    q = e2e.deployment.scalar
    ours = "FROM triage.jobs WHERE starts_with(classifier_version, 'llm:') AND left(batch_key, 10) IN ({})".format(
        ", ".join(f"'{day}'" for day in BATCH_DAYS)
    )
    assert q(f"SELECT count(*) {ours}") == 3 * DOCUMENTS
    assert q(f"SELECT count(DISTINCT batch_key) {ours}") == 3
    assert q(f"SELECT count(*) {ours} AND status = 'completed' AND attempt = 1") == 3 * DOCUMENTS
    assert q(f"SELECT count(*) FROM triage.document_labels WHERE job_id IN (SELECT id {ours})") == 3 * DOCUMENTS
    answers = "SELECT count(*) FROM triage.model_batch_answers a JOIN triage.jobs j ON j.id = a.job_id"
    assert q(f"{answers} WHERE j.id IN (SELECT id {ours})") == 3 * DOCUMENTS
    batches = (
        "SELECT count(DISTINCT b.key) FROM triage.model_batches b JOIN triage.model_batch_answers a ON a.batch = b.key"
    )
    assert q(f"{batches} WHERE b.status = 'collected' AND a.job_id IN (SELECT id {ours})") == 3
