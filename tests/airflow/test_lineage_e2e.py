"""OpenLineage events of a real ``classify_documents`` run (``airflow dags test``, dag.test())
with the provider's file transport: a START and a COMPLETE per task, and the datasets each
task read and wrote (docs/lineage.md)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.harness.deployment import Deployment

DOCUMENTS = 40
NAMESPACE = "triage-lineage-test"


@pytest.fixture(scope="module")
def events(deployment: Deployment) -> list[dict[str, Any]]:
    log_file = deployment.home / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(log_file), "append": True}
    done: subprocess.CompletedProcess[str] = deployment.dags_test(
        "classify_documents",
        "2026-11-02",
        "-c",
        json.dumps({"documents": DOCUMENTS}),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(transport),
        AIRFLOW__OPENLINEAGE__NAMESPACE=NAMESPACE,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return [json.loads(line) for line in Path(log_file).read_text().splitlines() if line.strip()]


def of(events: list[dict[str, Any]], task: str, event_type: str) -> list[dict[str, Any]]:
    return [e for e in events if e["job"]["name"] == f"classify_documents.{task}" and e["eventType"] == event_type]


def datasets(event: dict[str, Any], side: str) -> set[tuple[str, str]]:
    return {(d["namespace"], d["name"]) for d in event.get(side, [])}


@pytest.mark.parametrize("task", ["retrieve", "classify", "publish_events"])
def test_each_task_starts_and_completes(events: list[dict[str, Any]], task: str) -> None:
    assert of(events, task, "START"), sorted({(e["job"]["name"], e["eventType"]) for e in events})
    assert of(events, task, "COMPLETE")
    assert all(e["job"]["namespace"] == NAMESPACE for e in of(events, task, "COMPLETE"))


@pytest.mark.parametrize("task", ["persist", "alert"])
def test_a_task_the_scheduler_skipped_ran_no_process_and_sent_no_event(events: list[dict[str, Any]], task: str) -> None:
    """No label action: ``persist`` is mapped over nothing and ``publish_events`` alerted in
    place of the teardown, so neither started (issue #29); the datasets persist would write are
    classify's here."""
    assert not [e for e in events if e["job"]["name"] == f"classify_documents.{task}"]


def ledger_names(event: dict[str, Any], side: str) -> set[str]:
    return {name.rsplit(".", 1)[1] for namespace, name in datasets(event, side) if namespace.startswith("postgres://")}


def test_retrieve_reads_the_source_and_writes_the_ledger(events: list[dict[str, Any]]) -> None:
    completes = of(events, "retrieve", "COMPLETE")
    assert all(("triage", "synthetic") in datasets(e, "inputs") for e in completes)
    assert all({"jobs", "job_events", "outbox"} <= ledger_names(e, "outputs") for e in completes)
    registered = sum(e["run"]["facets"]["triage_jobs"]["counts"]["registered"] for e in completes)
    assert registered == DOCUMENTS


def test_classify_writes_labels_and_counts_its_jobs(events: list[dict[str, Any]]) -> None:
    completes = of(events, "classify", "COMPLETE")
    assert all("jobs" in ledger_names(e, "inputs") for e in completes)
    assert all({"classifications", "jobs"} <= ledger_names(e, "outputs") for e in completes)
    facets = [e["run"]["facets"]["triage_jobs"] for e in completes]
    assert sum(f["counts"]["claimed"] for f in facets) == DOCUMENTS
    assert all(f["batch"] == "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00" for f in facets)


def test_publish_writes_the_event_log_and_the_labels_asset(
    events: list[dict[str, Any]], deployment: Deployment
) -> None:
    (complete,) = of(events, "publish_events", "COMPLETE")
    written = datasets(complete, "outputs")
    assert ("triage", "document_labels") in written
    assert any(namespace == "file" and name.endswith(".jsonl") for namespace, name in written)
    # classify relays beside its work (triage.pipeline.trailing_relay): publish_events sends what is left.
    relayed = sum(e["run"]["facets"]["triage_jobs"]["counts"]["relayed"] for e in of(events, "classify", "COMPLETE"))
    assert complete["run"]["facets"]["triage_jobs"]["counts"]["published"] + relayed >= DOCUMENTS
    assert "outbox" in ledger_names(complete, "inputs")
