"""Batch mode through a real scheduler and triggerer: ``airflow backfill create ... --dag-run-conf
'{"classifier": "llm", "model_mode": "batch", ...}'`` (what ``./airflow.sh backfill create`` does
under ``make up``, whose ``airflow standalone`` runs a triggerer) and a run triggered through the
REST API with the same conf (what the UI's trigger form posts).

Each run's ``size_classify`` submits its day to the fake server's batch interface, defers, and
the triggerer (not a worker) polls the provider until the batch is done; the scheduler then
resumes the task on a worker, which collects, and ``classify`` completes every job from the
batch's answers: no interactive call."""

from __future__ import annotations

import contextlib
import json
import time

import pytest

from tests.dags.airflow_harness import AirflowCli, HarnessError, running_airflow, task_states, wait_for_runs
from tests.dags.conftest import ROOT, Deployment
from tests.fakes.openai_server import FakeOpenAIServer, fixed_label

DOCUMENTS = 40
CONF = {"classifier": "llm", "model_mode": "batch", "documents": DOCUMENTS}


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


@pytest.mark.slow
def test_a_batch_mode_backfill_and_a_triggered_run_wait_in_the_triggerer(deployment: Deployment) -> None:
    with FakeOpenAIServer(responder=fixed_label("billing")) as model:
        model.batches.polls_until_done = 10  # the task's first look, then ~9 s of the triggerer's polls
        conn = {"conn_type": "http", "host": model.base_url, "extra": {"batch_poll_seconds": 1}}
        env = {**deployment.env, "AIRFLOW_CONN_TRIAGE_LLM": json.dumps(conn)}
        with (
            running_airflow(
                env, ROOT / "dags", timeout=240, wait_for_dags=["classify_documents"], triggerer=True
            ) as af,
            AirflowCli(af.env, deployment.home / "airflow-cli.log") as airflow_cli,  # two commands, one import
        ):
            airflow_cli("dags", "unpause", "classify_documents")
            airflow_cli(
                "backfill",
                "create",
                "--dag-id",
                "classify_documents",
                "--from-date",
                "2026-11-01",
                "--to-date",
                "2026-11-02",
                "--dag-run-conf",
                json.dumps(CONF),
            )
            af.post(
                "/api/v2/dags/classify_documents/dagRuns",
                {"dag_run_id": "triggered", "logical_date": "2026-11-10T00:00:00Z", "conf": CONF},
            )
            seen = wait_for_task_state(af.env, "triggered", "size_classify", "deferred", timeout=300)
            backfill = wait_for_runs(af.env, "classify_documents", 2, ("success",), timeout=600, run_type="backfill")
            triggered = wait_for_runs(af.env, "classify_documents", 1, ("success",), timeout=300, run_type="manual")
            states = task_states(af.env, "classify_documents", "triggered")
    assert "deferred" in seen  # the wait ran in the triggerer, no worker slot held
    assert [r["state"] for r in backfill + triggered] == ["success"] * 3
    assert states["size_classify"] == "success", states
    assert model.batches.created == 3  # one provider batch a run
    assert model.request_count == 0  # no interactive call
    # The llm jobs: unpausing the DAG also lets the scheduler start its latest scheduled run, with
    # the params' defaults (keyword).
    q, llm = deployment.scalar, "FROM triage.jobs WHERE starts_with(classifier_version, 'llm:')"
    assert q(f"SELECT count(*) {llm}") == 3 * DOCUMENTS
    assert q(f"SELECT count(DISTINCT batch_key) {llm}") == 3
    assert q(f"SELECT count(*) {llm} AND status = 'completed' AND attempt = 1") == 3 * DOCUMENTS
    assert q(f"SELECT count(*) FROM triage.document_labels WHERE job_id IN (SELECT id {llm})") == 3 * DOCUMENTS
    assert q("SELECT count(*) FROM triage.model_batches WHERE status = 'collected'") == 3
    assert q("SELECT count(*) FROM triage.model_batch_answers") == 3 * DOCUMENTS
