"""classify_documents end to end: ``airflow dags test`` (dag.test()) on a real database."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.harness.deployment import Deployment

DRILL = {
    "transient_error_rate": 0.2,
    "permanent_error_rate": 0.02,
    "inconclusive_rate": 0.05,
    "duplicate_rate": 0.05,
    "seed": 11,
}
CONF = {"documents": 1500, "max_attempts": 3, "drill": DRILL}
BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"


def dags_test(deployment: Deployment, logical_date: str, conf: dict, **env: str) -> subprocess.CompletedProcess[str]:
    return deployment.dags_test("classify_documents", logical_date, "-c", json.dumps(conf), env=env)


def counts(deployment: Deployment) -> dict[str, object]:
    q = deployment.scalar
    return {
        "jobs": q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b", b=BATCH),
        "labels": q("SELECT count(*) FROM triage.document_labels"),
        "events": q("SELECT count(*) FROM triage.outbox"),
        "transitions": q("SELECT count(*) FROM triage.job_events"),
    }


@pytest.fixture(scope="module")
def first_run(deployment: Deployment) -> subprocess.CompletedProcess[str]:
    return dags_test(deployment, "2026-11-02", CONF)


def test_a_drilled_day_runs_to_success(first_run: subprocess.CompletedProcess[str]) -> None:
    assert first_run.returncode == 0, first_run.stdout[-4000:] + first_run.stderr[-4000:]


def test_every_job_is_settled(deployment: Deployment, first_run: subprocess.CompletedProcess[str]) -> None:
    q = deployment.scalar
    assert q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b", b=BATCH) == 1500  # duplicates register once
    unsettled = q(
        "SELECT count(*) FROM triage.jobs WHERE status NOT IN ('completed', 'manual_review', 'terminal_failed')"
    )
    assert unsettled == 0
    # the drill did inject faults and they took their documented routes
    assert q("SELECT count(*) FROM triage.job_events WHERE to_status = 'retryable_failed'") > 0
    assert q("SELECT count(*) FROM triage.manual_review WHERE reason = 'permanent_error'") > 0
    assert q("SELECT count(*) FROM triage.manual_review WHERE reason = 'inconclusive'") > 0


def test_labels_equal_completed_jobs(deployment: Deployment, first_run: subprocess.CompletedProcess[str]) -> None:
    q = deployment.scalar
    assert (
        q(
            "SELECT count(*) FROM triage.jobs j FULL JOIN triage.document_labels l ON l.job_id = j.id"
            " WHERE (j.status = 'completed') IS DISTINCT FROM (l.job_id IS NOT NULL)"
        )
        == 0
    )
    assert q("SELECT count(*) FROM triage.document_labels") == q(
        "SELECT count(*) FROM triage.jobs WHERE status = 'completed'"
    )


def test_events_were_published_once(deployment: Deployment, first_run: subprocess.CompletedProcess[str]) -> None:
    q = deployment.scalar
    unsent = "SELECT count(*) FROM triage.outbox WHERE (txid, event_id) > (SELECT txid, event_id FROM triage.outbox_watermark)"
    assert q(unsent) == 0
    lines = (deployment.home / "events" / "outbox.jsonl").read_text().splitlines()
    ids = [json.loads(line)["event_id"] for line in lines]
    assert len(ids) == len(set(ids)) == q("SELECT count(*) FROM triage.outbox")


def test_running_the_same_date_again_adds_nothing(
    deployment: Deployment, first_run: subprocess.CompletedProcess[str]
) -> None:
    before = counts(deployment)
    again = dags_test(deployment, "2026-11-02", CONF)
    assert again.returncode == 0, again.stdout[-3000:]
    assert counts(deployment) == before


def test_a_new_classifier_version_is_new_work(
    deployment: Deployment, first_run: subprocess.CompletedProcess[str], tmp_path: Path
) -> None:
    root = Path(__file__).resolve().parents[2]
    taxonomy = yaml.safe_load((root / "include" / "taxonomy.yaml").read_text())
    taxonomy["labels"][0]["keywords"] = [*taxonomy["labels"][0]["keywords"], "invoice copy request"]
    changed = tmp_path / "taxonomy.yaml"
    changed.write_text(yaml.safe_dump(taxonomy))
    before = deployment.scalar("SELECT count(DISTINCT classifier_version) FROM triage.jobs")
    run = dags_test(deployment, "2026-11-02", CONF, TRIAGE_TAXONOMY=str(changed))
    assert run.returncode == 0, run.stdout[-3000:]
    assert deployment.scalar("SELECT count(DISTINCT classifier_version) FROM triage.jobs") == before + 1
    assert deployment.scalar("SELECT count(*) FROM triage.jobs WHERE batch_key = :b", b=BATCH) == 3000


def test_a_misconfigured_model_fails_the_task_and_the_callback_sends_the_batch_to_review(
    deployment: Deployment,
) -> None:
    """401 from the model: no retry (AirflowFailException), and the failure callback moves the
    batch's unfinished jobs to manual_review with reason airflow_task_failed."""
    from tests.fakes.openai_server import FakeOpenAIServer, Reply

    with FakeOpenAIServer(responder=lambda _body: Reply.status_only(401)) as server:
        conn = json.dumps({"conn_type": "http", "host": f"{server.base_url}", "password": "sk-test"})
        run = dags_test(deployment, "2026-11-06", {"documents": 40, "classifier": "llm"}, AIRFLOW_CONN_TRIAGE_LLM=conn)
    assert run.returncode != 0
    batch = "2026-11-05T00:00:00+00:00/2026-11-06T00:00:00+00:00"
    q = deployment.scalar
    assert q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b", b=batch) == 40
    assert q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status = 'manual_review'", b=batch) == 40
    assert (
        q(
            "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id"
            " WHERE j.batch_key = :b AND r.reason = 'airflow_task_failed' AND r.resolved_at IS NULL",
            b=batch,
        )
        == 40
    )


def test_every_invariant_of_the_drill_holds(
    deployment: Deployment, first_run: subprocess.CompletedProcess[str]
) -> None:
    from triage_tools.drill.invariants import check_invariants

    engine = deployment.engine()
    try:
        with engine.connect() as conn:
            broken = [r for r in check_invariants(conn, [BATCH]) if not r.holds]
    finally:
        engine.dispose()
    assert broken == []
