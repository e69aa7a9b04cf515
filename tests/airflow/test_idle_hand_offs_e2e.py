"""No idle hand-offs (issue #29), through ``airflow dags test`` (dag.test(), the scheduler's own
expansion and trigger rules) on a real database: a run with nothing to persist has ``persist``
skipped by the scheduler (mapped over nothing) and ``publish_events`` alerting in place of the
``alert`` teardown; a run with a label action runs ``persist``, which sends every label; a run
whose classify fails still gets its alert from the teardown."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import sqlalchemy as sa

from tests.fakes.provider import FakeProvider
from tests.harness.deployment import Deployment

DAG_ID = "classify_documents"
DOCUMENTS = 40


def run(deployment: Deployment, logical_date: str, conf: dict[str, Any], **env: str) -> dict[str, Any]:
    """``dags test`` of one day: its exit code, its tasks' states (``task[map_index]`` for a
    mapped instance) and ``publish_events``' return value, read from the metadata database."""
    done = deployment.dags_test(DAG_ID, logical_date, "-c", json.dumps(conf), env=env)
    engine = sa.create_engine(deployment.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"], poolclass=sa.NullPool)
    try:
        with engine.connect() as conn:
            run_id = conn.execute(
                sa.text(
                    "SELECT run_id FROM dag_run WHERE dag_id = :d AND logical_date::date = :day"
                    " ORDER BY id DESC LIMIT 1"
                ),
                {"d": DAG_ID, "day": logical_date},
            ).scalar_one()
            rows = conn.execute(
                sa.text("SELECT task_id, map_index, state FROM task_instance WHERE dag_id = :d AND run_id = :r"),
                {"d": DAG_ID, "r": run_id},
            ).all()
            xcoms = conn.execute(
                sa.text("SELECT task_id, key, value FROM xcom WHERE dag_id = :d AND run_id = :r"),
                {"d": DAG_ID, "r": run_id},
            ).all()
    finally:
        engine.dispose()
    states = {task + (f"[{index}]" if index >= 0 else ""): state for task, index, state in rows}
    published = next((_json(v) for t, k, v in xcoms if (t, k) == ("publish_events", "return_value")), None)
    relayed = sum(int(_json(v).get("relayed", 0)) for t, k, v in xcoms if (t, k) == ("classify", "summary"))
    publish_xcom_keys = sorted(k for t, k, _ in xcoms if t == "publish_events")
    return {
        "done": done,
        "states": states,
        "published": published,
        "relayed_by_classify": relayed,
        "publish_xcom_keys": publish_xcom_keys,
    }


def _json(value: Any) -> dict[str, Any]:
    """An XCom value as the metadata database holds it (JSON, or JSON in a JSON string)."""
    while isinstance(value, str):
        value = json.loads(value)
    return value if isinstance(value, dict) else {}


def batch_of(logical_date: str) -> str:
    from datetime import date, timedelta

    day = date.fromisoformat(logical_date)
    return f"{day - timedelta(days=1)}T00:00:00+00:00/{day}T00:00:00+00:00"


def counts(deployment: Deployment, logical_date: str) -> dict[str, int]:
    q, batch = deployment.scalar, batch_of(logical_date)
    return {
        "jobs": q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b", b=batch),
        "completed": q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND status = 'completed'", b=batch),
        "settled": q(
            "SELECT count(*) FROM triage.jobs WHERE batch_key = :b"
            " AND status IN ('completed', 'manual_review', 'terminal_failed')",
            b=batch,
        ),
        "at_persist": q("SELECT count(*) FROM triage.jobs WHERE batch_key = :b AND step = 'persist'", b=batch),
    }


@pytest.fixture(scope="module")
def keyword_run(deployment: Deployment) -> dict[str, Any]:
    return run(deployment, "2026-11-12", {"documents": DOCUMENTS})


def test_a_run_with_nothing_to_persist_has_persist_skipped_by_the_scheduler(
    deployment: Deployment, keyword_run: dict[str, Any]
) -> None:
    """Keyword, no label action: classify completes every job itself and hands persist nothing,
    so the scheduler marks the unexpanded ``persist`` skipped (no instance, no process) and
    ``publish_events`` still runs and relays the run's events."""
    done, states = keyword_run["done"], keyword_run["states"]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert states["persist"] == "skipped", states
    assert not [name for name in states if name.startswith("persist[")], states  # never expanded
    assert states["classify[0]"] == "success", states
    assert states["publish_events"] == "success", states
    after = counts(deployment, "2026-11-12")
    assert (after["jobs"], after["settled"], after["at_persist"]) == (DOCUMENTS, DOCUMENTS, 0)
    assert after["completed"] > DOCUMENTS // 2  # keyword rules: the doubtful rest went to review
    # Relayed by the classify tasks while they worked, and by publish_events what was left.
    assert keyword_run["published"]["published"] + keyword_run["relayed_by_classify"] >= DOCUMENTS


def test_publish_events_alerted_and_skipped_the_alert_teardown(
    deployment: Deployment, keyword_run: dict[str, Any]
) -> None:
    """The run's alert counts come from ``publish_events``; the teardown it did the work of is
    skipped instead of starting a process of its own."""
    states, published = keyword_run["states"], keyword_run["published"]
    assert states["alert"] == "skipped", states
    alerted = published["run_alerts"]
    after = counts(deployment, "2026-11-12")
    assert alerted["batch_jobs"] == DOCUMENTS
    assert alerted["review_entered"] == after["settled"] - after["completed"]  # the doubtful ones
    assert alerted["terminal_failed"] == 0


def test_publish_events_leaves_no_skip_record_a_cleared_run_would_obey(keyword_run: dict[str, Any]) -> None:
    """``publish_events`` skips the teardown without SkipMixin's ``skipmixin_key`` XCom. That
    record outlives a clear (XComs are deleted only when the task runs again), and the scheduler's
    ``NotPreviouslySkippedDep`` obeys it: a cleared run whose classify then failed (publish_events
    upstream_failed, never run) would have its ``alert`` teardown skipped by the stale record, and
    the run would fail with no alert."""
    assert keyword_run["states"]["alert"] == "skipped", keyword_run["states"]
    assert "return_value" in keyword_run["publish_xcom_keys"]
    assert "skipmixin_key" not in keyword_run["publish_xcom_keys"], keyword_run["publish_xcom_keys"]


def test_with_a_label_action_persist_runs_and_sends_every_label(deployment: Deployment) -> None:
    """The label action connection makes classify hand its accepted jobs to persist: persist is
    expanded (one instance per classify instance that left it work) and completes them after
    sending each label with its idempotency key."""
    with FakeProvider() as provider:
        conn = json.dumps({"conn_type": "http", "host": provider.url})
        result = run(deployment, "2026-11-14", {"documents": DOCUMENTS}, AIRFLOW_CONN_TRIAGE_LABEL_ACTION=conn)
        sent = len(provider.effects)
    done, states = result["done"], result["states"]
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert states["persist[0]"] == "success", states
    assert states["publish_events"] == "success", states
    assert states["alert"] == "skipped", states
    after = counts(deployment, "2026-11-14")
    assert (after["jobs"], after["settled"]) == (DOCUMENTS, DOCUMENTS)
    assert after["completed"] > DOCUMENTS // 2
    assert sent == after["completed"]  # every completed job's label reached the provider once


@pytest.fixture
def failing_model() -> Iterator[str]:
    from tests.fakes.openai_server import FakeOpenAIServer, Reply

    with FakeOpenAIServer(responder=lambda _body: Reply.status_only(401)) as server:
        yield json.dumps({"conn_type": "http", "host": f"{server.base_url}", "password": "sk-test"})


def test_a_run_whose_classify_fails_still_alerts_through_the_teardown(
    deployment: Deployment, failing_model: str
) -> None:
    """401 from the model fails classify without retry: persist and publish_events never run
    (upstream failed), and the ``alert`` teardown counts the jobs the failure callback sent to
    review; the run fails on classify, not on the alert."""
    result = run(
        deployment, "2026-11-16", {"documents": DOCUMENTS, "classifier": "llm"}, AIRFLOW_CONN_TRIAGE_LLM=failing_model
    )
    states = result["states"]
    assert result["done"].returncode != 0
    assert states["classify[0]"] == "failed", states
    assert states["persist"] == "upstream_failed", states
    assert states["publish_events"] == "upstream_failed", states
    assert states["alert"] == "success", states
