"""review_jobs end to end: ``airflow dags test`` with a conf on a real job database (the trigger
form's REST twin and the human-in-the-loop answer through a running Airflow:
tests/e2e/test_review_jobs_e2e.py)."""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.harness.deployment import Deployment
from tests.ledger.helpers import new_jobs

ROOT = Path(__file__).resolve().parents[2]


def fresh_batch() -> str:
    """A batch key no other test of the module uses (the deployment, and its job database, are shared)."""
    from triage.jobs.vocabulary.models import batch_key_for

    start = datetime(2026, 10, 1, tzinfo=UTC) + timedelta(minutes=uuid.uuid4().int % 10**7)
    return batch_key_for(start, start + timedelta(days=1))


def jobs_in_review(deployment: Deployment, n: int, batch: str | None = None) -> list[str]:
    """Register ``n`` fresh documents and send them to review as inconclusive model answers.

    Each call uses a batch of its own unless told otherwise: the claim takes any claimable job of
    its batch, and a shared batch holds the jobs an earlier test requeued (``queued``), which the
    claim would take instead of these, leaving these ``queued`` and not in review.
    """
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.models import ClassificationRecord, SendToReview

    batch = batch or fresh_batch()
    engine = deployment.engine()
    try:
        store = JobStore(engine)
        registered = store.register(
            new_jobs(n, prefix=f"review-{uuid.uuid4().hex[:8]}"), batch_key=batch, step="classify", max_attempts=3
        )
        claim = store.claim(batch_key=batch, step="classify", limit=n, lease_seconds=60, owner="test-worker")
        claimed = sorted(str(j.id) for j in claim.jobs)
        assert claimed == sorted(str(i) for i in registered.new_ids), "the claim took other jobs than these"
        model = ClassificationRecord("billing", 0.4, "inconclusive", "keyword-v1")
        store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive", classification=model) for j in claim.jobs])
    finally:
        engine.dispose()
    return [str(i) for i in registered.new_ids]


def dags_test(
    deployment: Deployment, conf: dict[str, Any], dag_id: str = "review_jobs"
) -> subprocess.CompletedProcess[str]:
    return deployment.dags_test(dag_id, "-c", json.dumps(conf), timeout=300)


def review_row(deployment: Deployment, job_id: str) -> tuple[Any, ...]:
    engine = deployment.engine()
    try:
        with engine.connect() as conn:
            import sqlalchemy as sa

            return tuple(
                conn.execute(
                    sa.text(
                        "SELECT j.status::text, r.resolution, r.resolved_by, r.note,"
                        " (SELECT actor FROM triage.job_events e WHERE e.job_id = j.id ORDER BY e.id DESC LIMIT 1)"
                        " FROM triage.jobs j JOIN triage.manual_review r ON r.job_id = j.id"
                        " WHERE j.id = :j ORDER BY r.id DESC LIMIT 1"
                    ),
                    {"j": job_id},
                ).one()
            )
    finally:
        engine.dispose()


def transitions(deployment: Deployment) -> object:
    return deployment.scalar("SELECT count(*) FROM triage.job_events")


def output(run: subprocess.CompletedProcess[str]) -> str:
    return run.stdout[-4000:] + run.stderr[-4000:]


def test_the_dag_is_on_demand_with_a_typed_form() -> None:
    from airflow.dag_processing.dagbag import DagBag
    from airflow.sdk.definitions.param import ParamValidationError
    from airflow.sdk.definitions.timetables.simple import NullTimetable

    bag = DagBag(dag_folder=str(ROOT / "dags"))
    assert bag.import_errors == {}
    for dag_id in ("review_jobs", "review_jobs_interactive"):
        dag = bag.dags[dag_id]
        assert isinstance(dag.timetable, NullTimetable), dag_id
        assert {"triage", "review"} <= set(dag.tags)
    params = bag.dags["review_jobs"].params
    assert set(params.keys()) == {
        "job_ids",
        "decision",
        "label",
        "note",
        "max_replays",
        "reason",
        "error_class",
        "states",
        "source",
        "batch_key",
        "since",
        "until",
        "limit",
        "dry_run",
    }
    assert "billing" in params.get_param("label").schema["enum"]
    assert params["dry_run"] is True  # a replay from the form is a dry run unless unticked
    assert params.get_param("states").resolve(["manual_review", "terminal_failed"])
    for name, value in [
        ("job_ids", ["not-a-uuid"]),
        ("decision", "approve"),
        ("label", "spam"),
        ("max_replays", 0),
        ("states", ["completed"]),
        ("states", []),
        ("limit", 10_001),
        ("reason", "x; DROP TABLE"),
        ("source", "a\u202eb"),
        ("dry_run", "no"),
    ]:
        with pytest.raises(ParamValidationError):
            params.get_param(name).resolve(value)
    for name in params:
        assert params.get_param(name).description, name
    # JSON schema's "format" only annotates (the form's date picker): a bad date passes the form,
    # and the run refuses it when it starts (test_replay_operator)
    assert params.get_param("since").resolve("yesterday") == "yesterday"


def test_a_label_decision_is_applied_as_the_triggering_user(deployment: Deployment) -> None:
    ids = jobs_in_review(deployment, 2)
    run = dags_test(deployment, {"job_ids": ids, "decision": "label", "label": "billing", "note": "invoices"})
    assert run.returncode == 0, output(run)
    for job_id in ids:
        # `dags test` names its runs' user "dag_test"; the UI and REST API name the logged-in user
        assert review_row(deployment, job_id) == ("completed", "labelled", "dag_test", "invoices", "dag_test")
    assert (
        deployment.scalar(
            "SELECT count(*) FROM triage.document_labels WHERE job_id = ANY(:ids)", ids=[uuid.UUID(i) for i in ids]
        )
        == 2
    )

    # the same decision again: success, reported as already applied, nothing changes
    before = transitions(deployment)
    again = dags_test(deployment, {"job_ids": ids, "decision": "label", "label": "billing", "note": "invoices"})
    assert again.returncode == 0, output(again)
    assert "already_applied" in again.stdout + again.stderr
    assert transitions(deployment) == before


def test_one_refused_job_fails_the_run_after_the_others_are_applied(deployment: Deployment) -> None:
    (good,) = jobs_in_review(deployment, 1)
    unknown = str(uuid.uuid4())
    run = dags_test(deployment, {"job_ids": [unknown, good], "decision": "reject", "note": "spam"})
    assert run.returncode != 0
    assert f"{unknown}: JobNotFound" in output(run)
    assert review_row(deployment, good)[:3] == ("terminal_failed", "rejected", "dag_test")


@pytest.mark.parametrize(
    ("conf", "message"),
    [
        pytest.param({"decision": "label"}, "decision 'label' needs a label", id="label-without-label"),
        pytest.param(
            {"decision": "requeue", "label": "billing"}, "a label is only for decision 'label'", id="label-with-requeue"
        ),
    ],
)
def test_an_invalid_decision_changes_nothing(deployment: Deployment, conf: dict[str, Any], message: str) -> None:
    (job_id,) = jobs_in_review(deployment, 1)
    before = transitions(deployment)
    run = dags_test(deployment, {"job_ids": [job_id], **conf})
    assert run.returncode != 0
    assert message in output(run)
    assert transitions(deployment) == before
    assert review_row(deployment, job_id)[:2] == ("manual_review", None)


def test_a_replay_by_filter_is_a_dry_run_then_applied_once_as_the_triggering_user(deployment: Deployment) -> None:
    batch = fresh_batch()  # the filter selects this test's jobs only
    ids = jobs_in_review(deployment, 2, batch)
    conf = {"decision": "replay", "reason": "inconclusive", "batch_key": batch, "limit": 10_000}
    before = transitions(deployment)
    dry = dags_test(deployment, conf)
    assert dry.returncode == 0, output(dry)
    assert "**dry run**" in output(dry)
    assert ids[0] in output(dry)  # the preview lists the jobs (ids, never a document)
    assert transitions(deployment) == before

    applied = dags_test(deployment, {**conf, "dry_run": False, "note": "model fixed"})
    assert applied.returncode == 0, output(applied)
    for job_id in ids:
        assert review_row(deployment, job_id) == ("queued", "requeued", "dag_test", "model fixed", "dag_test")
    after = transitions(deployment)
    again = dags_test(deployment, {**conf, "dry_run": False, "note": "model fixed"})
    assert again.returncode == 0, output(again)
    assert "**already applied**" in output(again)
    assert transitions(deployment) == after


# -- through a running Airflow: the form's REST twin and the human-in-the-loop answer -----------


def wait_for(check: Callable[[], Any], timeout: float = 120, what: str = "") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def _awaiting(af: Any, path: str) -> dict[str, Any] | None:
    from tests.harness.airflow import HarnessError

    try:
        detail = af.get(path)
    except HarnessError:
        return None
    return detail if detail and detail.get("task_instance", {}).get("state") == "awaiting_input" else None


def _finished(af: Any, run_id: str) -> dict[str, str | None] | None:
    from tests.harness.airflow import task_states

    states = task_states(af.env, "review_jobs_interactive", run_id)
    return states if states.get("apply_answer") in ("success", "failed", "upstream_failed", "skipped") else None
