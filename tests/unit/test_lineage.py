"""OpenLineage facets of Triage's operators (triage.operators.lineage): what the provider is
told, and that nothing about lineage can fail a task. tests/airflow/test_lineage_e2e.py runs a DAG
with the file transport and reads the events."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from triage.contracts.intake import INTAKE_BATCH
from triage.operators import lineage
from triage.operators.base import TriageOperator
from triage.operators.classify_documents import PersistLabelsOperator

URL = "postgresql+psycopg://triage_app:secret@db.internal:5433/triage"


class OnAnyEngine(PersistLabelsOperator):
    """The seam: an engine on a URL (never connected) instead of the triage_db connection."""

    def get_engine(self) -> sa.Engine:
        return sa.create_engine(URL)


def context() -> dict[str, Any]:
    return {
        "data_interval_start": datetime(2026, 11, 1, tzinfo=UTC),
        "data_interval_end": datetime(2026, 11, 2, tzinfo=UTC),
        "task": None,
    }


@pytest.mark.parametrize(
    ("where", "expected"),
    [
        pytest.param("/data/inbox", ("file", "/data/inbox"), id="path"),
        pytest.param(Path("/data/inbox"), ("file", "/data/inbox"), id="pathlib"),
        pytest.param("s3://bucket/inbox/2026", ("s3://bucket", "/inbox/2026"), id="s3"),
        pytest.param(
            "https://user:pw@labels.example:8443/v1/labels",
            ("https://labels.example:8443", "/v1/labels"),
            id="no-credentials",
        ),
        pytest.param("http://127.0.0.1:9000", ("http://127.0.0.1:9000", "/"), id="no-path"),
    ],
)
def test_locations(where: str | Path, expected: tuple[str, str]) -> None:
    assert lineage.location(where) == expected


def test_ledger_tables_are_named_as_openlineage_names_postgres() -> None:
    url = sa.engine.make_url(URL)
    assert lineage.ledger(url, "jobs") == [("postgres://db.internal:5433", "triage.triage.jobs")]
    socket = sa.engine.make_url("postgresql+psycopg://triage_worker@/triage?host=/run/pg")
    assert lineage.ledger(socket, "jobs") == [("postgres://localhost:5432", "triage.triage.jobs")]


def test_counts_are_numbers_only_nested_ones_flattened() -> None:
    done = {"claimed": 3, "outcomes": {"completed": 2, "manual_review": 1}, "seconds": 0.4, "worker": True}
    assert lineage.counts(done) == {"claimed": 3, "outcomes.completed": 2, "outcomes.manual_review": 1}


def test_a_persist_try_reports_the_ledger_and_the_label_provider() -> None:
    task = OnAnyEngine(task_id="persist")
    done = {"claimed": 2, "outcomes": {"completed": 2}}
    task.record_lineage(
        lambda: task.ledger_lineage(
            context(),  # type: ignore[arg-type]  # a stand-in for Airflow's task context
            ["jobs"],
            ["document_labels"],
            done,
            also_written=[lineage.location("https://labels.example/v1/labels")],
        )
    )
    facets = task.get_openlineage_facets_on_complete(task_instance=None)
    assert [(d.namespace, d.name) for d in facets.inputs] == [("postgres://db.internal:5433", "triage.triage.jobs")]
    assert [(d.namespace, d.name) for d in facets.outputs] == [
        ("postgres://db.internal:5433", "triage.triage.document_labels"),
        ("https://labels.example", "/v1/labels"),
    ]
    facet = facets.run_facets[lineage.FACET]
    assert facet.counts == {"claimed": 2, "outcomes.completed": 2}
    assert facet.batch.startswith("2026-11-01")
    assert "secret" not in repr(facets)


def test_the_intake_batch_reads_the_intake_asset() -> None:
    task = OnAnyEngine(task_id="persist", batch=INTAKE_BATCH)
    task.record_lineage(lambda: task.ledger_lineage({"task": task}, ["jobs"], ["jobs"], {}))
    facets = task.get_openlineage_facets_on_complete(task_instance=None)
    assert (facets.inputs[0].namespace, facets.inputs[0].name) == ("triage", "intake")


def test_no_lineage_recorded_means_no_facets() -> None:
    assert OnAnyEngine(task_id="persist").get_openlineage_facets_on_complete(task_instance=None) is None


def test_an_error_while_recording_never_reaches_the_task(caplog: pytest.LogCaptureFixture) -> None:
    task = OnAnyEngine(task_id="persist")

    def broken() -> lineage.Lineage:
        raise ValueError("document text that must not be logged")

    with caplog.at_level(logging.WARNING, logger="triage.operators.lineage"):
        task.record_lineage(broken)
    assert task.get_openlineage_facets_on_complete(task_instance=None) is None
    assert "ValueError" in caplog.text
    assert "document text" not in caplog.text


def test_an_error_while_answering_never_reaches_the_task(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A provider release that moved OperatorLineage, say."""
    task = OnAnyEngine(task_id="persist")
    task.record_lineage(lambda: lineage.Lineage(inputs=[("file", "/x")]))

    def moved(recorded: lineage.Lineage | None) -> Any:
        raise ImportError("cannot import name 'OperatorLineage'")

    monkeypatch.setattr(lineage, "operator_lineage", moved)
    with caplog.at_level(logging.WARNING, logger="triage.operators.lineage"):
        assert task.get_openlineage_facets_on_complete(task_instance=None) is None
    assert "ImportError" in caplog.text


def test_every_operator_answers_the_provider() -> None:
    assert TriageOperator.get_openlineage_facets_on_complete is PersistLabelsOperator.get_openlineage_facets_on_complete
