"""reconcile_jobs end to end through ``airflow dags test`` on a fresh metadata database: it
repairs crafted cases in the job database, writes the three forms of its report, and reads
Airflow's own task states through a real API server's REST API."""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.harness.airflow import AIRFLOW, free_port
from tests.harness.deployment import Deployment
from tests.ledger.helpers import insert_job, new_jobs
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.states import JobStatus

BATCH = "2026-11-10T00:00:00+00:00/2026-11-11T00:00:00+00:00"


def dags_test(
    deployment: Deployment, dag_id: str, logical_date: str, conf: dict[str, Any], **env: str
) -> subprocess.CompletedProcess[str]:
    return deployment.dags_test(dag_id, logical_date, "-c", json.dumps(conf), env=env)


def unused_api() -> str:
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture(scope="module")
def crafted(deployment: Deployment) -> dict[str, Any]:
    """An expired lease and a job in review that lost its review row."""
    engine = deployment.engine()
    store = JobStore(engine)
    store.register(new_jobs(3, prefix="e2e"), batch_key=BATCH, step="classify", max_attempts=3)
    claim = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="dead-worker")
    with engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")
        )
        lost = insert_job(conn, JobStatus.MANUAL_REVIEW, batch_key=BATCH)
    engine.dispose()
    return {"expired": claim.jobs[0].id, "lost": lost}


@pytest.fixture(scope="module")
def dry(deployment: Deployment, crafted: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return dags_test(
        deployment,
        "reconcile_jobs",
        "2026-11-30T10:00:00+00:00",
        {"dry_run": True, "grace_seconds": 0},
        AIRFLOW__API__BASE_URL=unused_api(),
    )


@pytest.fixture(scope="module")
def first(deployment: Deployment, dry: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    return dags_test(
        deployment,
        "reconcile_jobs",
        "2026-11-30T10:15:00+00:00",
        {"grace_seconds": 0},
        AIRFLOW__API__BASE_URL=unused_api(),
    )


def test_a_dry_run_succeeds_and_changes_nothing(
    deployment: Deployment, crafted: dict[str, Any], dry: subprocess.CompletedProcess[str]
) -> None:
    assert dry.returncode == 0, dry.stdout[-4000:] + dry.stderr[-4000:]
    q = deployment.scalar
    assert q("SELECT status FROM triage.jobs WHERE id = :j", j=crafted["expired"]) == "running"
    assert q("SELECT count(*) FROM triage.manual_review WHERE job_id = :j", j=crafted["lost"]) == 0
    assert q("SELECT dry_run FROM triage.reconciliation_runs ORDER BY id LIMIT 1") is True
    # the Airflow run that made it, by which its run page's Triage report tab finds the report
    assert str(q("SELECT dag_run_id FROM triage.reconciliation_runs ORDER BY id LIMIT 1")).startswith("manual__")
    assert "ALERT kind=orphans" not in dry.stdout + dry.stderr  # a dry run takes nothing back


def test_a_run_repairs_and_reports_in_three_forms(
    deployment: Deployment, crafted: dict[str, Any], first: subprocess.CompletedProcess[str]
) -> None:
    assert first.returncode == 0, first.stdout[-4000:] + first.stderr[-4000:]
    q = deployment.scalar
    assert q("SELECT status FROM triage.jobs WHERE id = :j", j=crafted["expired"]) == "retryable_failed"
    assert (
        q("SELECT reason FROM triage.manual_review WHERE job_id = :j AND resolved_at IS NULL", j=crafted["lost"])
        == "reconciliation_missing_review"
    )
    log = first.stdout + first.stderr
    assert "# Reconciliation run" in log
    assert "## Manual review queue" in log
    assert "HTML report: " in log
    # The expired lease was a dead worker's: the orphans alert, in the log without triage_alerts.
    assert "ALERT kind=orphans dag=reconcile_jobs" in log
    assert "repairs={'lease_released': 1}" in log
    path = Path(str(q("SELECT report_path FROM triage.reconciliation_runs WHERE NOT dry_run ORDER BY id DESC LIMIT 1")))
    assert path.parent == deployment.home / "reports"
    assert path.exists()
    assert "<svg" in path.read_text()
    summary: Any = q("SELECT summary FROM triage.reconciliation_runs WHERE NOT dry_run ORDER BY id DESC LIMIT 1")
    assert {r["action"] for r in summary["repairs"]} >= {"lease_released", "insert_missing_review"}
    assert summary["totals"]["skipped"]["airflow_view"].startswith("Airflow's REST API is unavailable")


def test_a_second_run_repairs_nothing(deployment: Deployment, first: subprocess.CompletedProcess[str]) -> None:
    again = dags_test(
        deployment,
        "reconcile_jobs",
        "2026-11-30T10:30:00+00:00",
        {"grace_seconds": 0},
        AIRFLOW__API__BASE_URL=unused_api(),
    )
    assert again.returncode == 0, again.stdout[-3000:]
    assert "ALERT kind=orphans" not in again.stdout + again.stderr
    summary: Any = deployment.scalar("SELECT summary FROM triage.reconciliation_runs ORDER BY id DESC LIMIT 1")
    assert summary["repairs"] == []


def test_invalid_params_fail_without_retrying(deployment: Deployment) -> None:
    bad = dags_test(deployment, "reconcile_jobs", "2026-11-30T10:45:00+00:00", {"max_rescues": -1})
    assert bad.returncode != 0


# -- Airflow's view through a real API server -------------------------------------------------------


@contextlib.contextmanager
def api_server(deployment: Deployment) -> Iterator[str]:
    """``airflow api-server`` on the deployment's metadata database (no scheduler needed: the
    task instances come from ``dags test`` runs)."""
    from triage_tools.local import health

    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    env = {
        **deployment.env,
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__BASE_URL": base_url,
    }
    log = (deployment.home / "api-server.log").open("ab")
    proc = subprocess.Popen(
        [*AIRFLOW, "api-server"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while health(base_url) is None:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError((deployment.home / "api-server.log").read_text()[-3000:])
            time.sleep(0.5)
        yield base_url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


@pytest.mark.slow
def test_a_failed_classify_task_with_unfinished_work_is_found_through_the_rest_api(deployment: Deployment) -> None:
    """classify fails for good (a 401 from the model); the callback of the last map index to
    fail sends the batch to review. Work registered for the batch afterwards is what a lost
    callback leaves behind: unfinished jobs under a failed task. reconcile_jobs finds it through
    the REST API and moves it."""
    from tests.fakes.openai_server import FakeOpenAIServer, Reply
    from tests.harness.airflow import _request

    with FakeOpenAIServer(responder=lambda _body: Reply.status_only(401)) as server:
        conn = json.dumps({"conn_type": "http", "host": f"{server.base_url}", "password": "sk-test"})
        failed = dags_test(
            deployment,
            "classify_documents",
            "2026-11-13",
            {"documents": 10, "classifier": "llm"},
            AIRFLOW_CONN_TRIAGE_LLM=conn,
        )
    assert failed.returncode != 0
    batch = "2026-11-12T00:00:00+00:00/2026-11-13T00:00:00+00:00"
    engine = deployment.engine()
    JobStore(engine).register(new_jobs(5, prefix="lost-callback"), batch_key=batch, step="classify", max_attempts=3)
    engine.dispose()

    with api_server(deployment) as base_url:
        run = dags_test(
            deployment,
            "reconcile_jobs",
            "2026-11-30T11:00:00+00:00",
            {"grace_seconds": 0},
            AIRFLOW__API__BASE_URL=base_url,
        )
        assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
        runs = _request(f"{base_url}/api/v2/dags/reconcile_jobs/dagRuns?order_by=-id&limit=1")["dag_runs"]
        run_id = urllib.parse.quote(runs[0]["dag_run_id"], safe="")
        xcom = _request(
            f"{base_url}/api/v2/dags/reconcile_jobs/dagRuns/{run_id}/taskInstances/reconcile"
            "/xcomEntries/return_value?deserialize=true"
        )
    summary = xcom["value"] if isinstance(xcom["value"], dict) else json.loads(xcom["value"])
    view = next(r for r in summary["rules"] if r["rule"] == "airflow_view")
    assert view["skipped"] is None
    assert [(f["check"], f["count"]) for f in view["findings"]] == [("task_failed", 5)]
    assert [(r["action"], r["count"]) for r in view["repairs"]] == [("batch_sent_to_review", 5)]
    q = deployment.scalar
    assert q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status <> 'manual_review'", b=batch) == 0
    assert (
        q(
            "SELECT count(*) FROM triage.manual_review WHERE context->>'repaired_by' = 'reconciliation'"
            " AND reason = 'airflow_task_failed'"
        )
        == 5
    )
