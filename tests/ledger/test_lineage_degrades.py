"""Nothing about lineage can fail a task, through a real ``execute`` on a real PostgreSQL:
``publish_events`` (seam subclass, no Airflow run) relays its events and returns its count
whether its lineage is intact or broken; broken, it answers the OpenLineage provider with no
lineage and logs the error's class only (docs/lineage.md, "Lineage never fails a task")."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.ledger.test_pipeline_publish import file_ids, outbox_ids, register
from tests.ledger.test_review_operators import seamed
from triage.jobs.store import JobStore
from triage.operators import lineage
from triage.operators.classify_documents import PublishEventsOperator

DOCUMENTS = 3


def context() -> dict[str, Any]:
    return {
        "data_interval_start": datetime(2026, 11, 1, tzinfo=UTC),
        "data_interval_end": datetime(2026, 11, 2, tzinfo=UTC),
        "task": None,
    }


def publish(store: JobStore, events: Path) -> tuple[Any, dict[str, Any]]:
    task = seamed(PublishEventsOperator, store.engine, event_log=str(events))
    return task, task.execute(context())


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_intact_lineage_names_what_publish_events_read_and_wrote(store: JobStore, tmp_path: Path) -> None:
    """The control: the same try with lineage intact reports the outbox, the event log and the
    labels asset, with its count."""
    register(store, DOCUMENTS)
    task, done = publish(store, tmp_path / "events.jsonl")
    assert done == {"published": DOCUMENTS}
    facets = task.get_openlineage_facets_on_complete(task_instance=None)
    assert facets is not None
    assert {d.name.rsplit(".", 1)[-1] for d in facets.inputs} == {"outbox"}
    assert ("triage", "document_labels") in {(d.namespace, d.name) for d in facets.outputs}
    assert facets.run_facets[lineage.FACET].counts == {"published": DOCUMENTS}


@pytest.mark.own_database  # the relay sends only what committed transactions wrote
def test_broken_lineage_never_fails_publish_events(
    store: JobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    register(store, DOCUMENTS)
    sent = outbox_ids(store)

    def broken(*args: Any) -> list[lineage.Dataset]:
        raise RuntimeError("postgres://secret-host must not be logged")

    monkeypatch.setattr(lineage, "ledger", broken)
    events = tmp_path / "events.jsonl"
    with caplog.at_level(logging.WARNING, logger="triage.operators.lineage"):
        task, done = publish(store, events)
        facets = task.get_openlineage_facets_on_complete(task_instance=None)
    assert done == {"published": DOCUMENTS}
    assert set(file_ids(events)) == sent  # the work itself happened, every event once
    assert facets is None
    assert "RuntimeError" in caplog.text
    assert "secret-host" not in caplog.text
