"""Document ids and labels carrying SQL, quoting and control characters, through the real
pipeline on a real PostgreSQL: ids stored verbatim, harming nothing; labels outside the
taxonomy (every hostile one) refused by the database itself (migration 0021), harming nothing
either. NUL, which PostgreSQL text cannot hold, is routed to manual review with a reason instead
of failing the batch."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from triage.classifiers.base import ClassifyRequest, ModelOutput
from triage.classifiers.taxonomy import Taxonomy
from triage.jobs.store import JobStore
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import retrieve
from triage.pipeline.steps import RunSettings, run_step
from triage.sources.jsonl import JsonlSource

DAY = datetime(2026, 11, 1, tzinfo=UTC)
BATCH = "hostile"

HOSTILE = [
    "'; DROP TABLE triage.jobs; --",
    "x'); DELETE FROM triage.job_events; --",
    "$$; DROP SCHEMA triage CASCADE; $$",
    "$tag$ \\ back\\slash \\' \\\\ %s %(id)s :id ?",
    'quote " double; -- comment /* block */',
    "ctl\x01\x02\x1b[31m\x7f",
    "tab\there\nnew line\rreturn\r\nboth",
    "unicode\u2028line\u2029para\u0085nel\ufeffbom",
    "emoji \U0001f4a5 and rtl \u202eevil",
]
NUL_ID = "nul\x00inside"
NUL_LABEL_ID = "label-with-nul"


class EchoClassifier:
    """Answers each document with the label the test chose for its id: hostile labels too."""

    version = "echo-v1"

    def __init__(self, labels: dict[str, str]) -> None:
        self.labels = labels

    def classify(self, request: ClassifyRequest) -> ModelOutput:
        return ModelOutput(
            label=self.labels[request.external_id], confidence=0.99, rejected_reason=None, latency_ms=0.1
        )

    def close(self) -> None:
        pass


def ticket(external_id: str) -> str:
    return json.dumps({"id": external_id, "subject": "s", "body": "b", "received_at": "2026-11-01T08:00:00+00:00"})


def run(store: JobStore, tmp_path: Path, labels: dict[str, str], ids: list[str]) -> None:
    inbox = tmp_path / "inbox" / "2026-11-01"
    inbox.mkdir(parents=True)
    (inbox / "export.jsonl").write_text("\n".join(ticket(i) for i in ids) + "\n", encoding="utf-8")
    payloads = PayloadStore(tmp_path / "payloads")
    classifier = EchoClassifier(labels)
    result = retrieve(
        store,
        JsonlSource(tmp_path / "inbox"),
        payloads,
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version=classifier.version,
        max_attempts=2,
    )
    assert result.read == len(ids)
    handler = ClassifyHandler(classifier, payloads, ClassifySettings(0.5))
    try:
        run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="hostile"))
    finally:
        handler.close()


def all_rows(store: JobStore, sql: str) -> list[sa.Row[Any]]:
    with store.engine.connect() as conn:
        return list(conn.execute(sa.text(sql)).all())


TAXONOMY_LABELS = sorted(Taxonomy.load().names)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_ids_are_stored_verbatim_and_harm_nothing(store: JobStore, tmp_path: Path) -> None:
    labels = {external_id: TAXONOMY_LABELS[i % len(TAXONOMY_LABELS)] for i, external_id in enumerate(HOSTILE)}
    tables_before = all_rows(store, "SELECT tablename FROM pg_tables WHERE schemaname = 'triage' ORDER BY 1")
    run(store, tmp_path, labels, HOSTILE)

    stored: dict[str, str] = dict(
        r._tuple() for r in all_rows(store, "SELECT external_id, label FROM triage.document_labels")
    )
    assert stored == labels
    assert {r.external_id for r in all_rows(store, "SELECT external_id FROM triage.jobs")} == set(HOSTILE)
    assert all_rows(store, "SELECT DISTINCT status::text FROM triage.jobs") == [("completed",)]
    assert {r.label for r in all_rows(store, "SELECT label FROM triage.classifications")} == set(labels.values())
    # the events carry them as JSON, verbatim after decoding
    payloads = [
        r.payload for r in all_rows(store, "SELECT payload FROM triage.outbox WHERE event_type = 'job.completed'")
    ]
    assert {p.get("label") for p in payloads} <= set(labels.values()) | {None}
    # nothing was dropped, deleted or rewritten
    assert all_rows(store, "SELECT tablename FROM pg_tables WHERE schemaname = 'triage' ORDER BY 1") == tables_before
    assert all_rows(store, "SELECT count(*) FROM triage.job_events") == [(len(HOSTILE) * 3,)]

    # a second run of the same inbox registers nothing: the ids are keys, exactly
    again = retrieve(
        store,
        JsonlSource(tmp_path / "inbox"),
        PayloadStore(tmp_path / "payloads"),
        start=DAY,
        end=DAY + timedelta(days=1),
        batch_key=BATCH,
        classifier_version="echo-v1",
        max_attempts=2,
    )
    assert (again.registered, again.existing) == (0, len(HOSTILE))


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_hostile_labels_are_refused_by_the_database_and_harm_nothing(store: JobStore) -> None:
    """Whoever writes them (a classifier that skipped its checks, raw SQL): the label is a bound
    value the check quotes in its message, never SQL."""
    tables_before = all_rows(store, "SELECT tablename FROM pg_tables WHERE schemaname = 'triage' ORDER BY 1")
    for n, label in enumerate(HOSTILE):
        with store.engine.begin() as conn, pytest.raises(sa.exc.IntegrityError, match="is not in the taxonomy"):
            conn.execute(
                sa.text(
                    "INSERT INTO triage.document_labels (source, external_id, label, classifier_version,"
                    " content_sha256, job_id, job_created_at) VALUES ('s', :e, :label, 'v', 'h', gen_random_uuid(),"
                    " now())"
                ),
                {"e": f"e{n}", "label": label},
            )
    assert all_rows(store, "SELECT count(*) FROM triage.document_labels") == [(0,)]
    assert all_rows(store, "SELECT tablename FROM pg_tables WHERE schemaname = 'triage' ORDER BY 1") == tables_before


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_nul_in_an_id_or_a_label_goes_to_review_with_a_reason(store: JobStore, tmp_path: Path) -> None:
    ids = ["fine-1", NUL_ID, NUL_LABEL_ID, "fine-2"]
    labels = {"fine-1": "billing", "fine-2": "shipping", NUL_LABEL_ID: "bill\x00ing"}
    run(store, tmp_path, labels, ids)

    rows = all_rows(
        store,
        "SELECT j.external_id, j.status::text, r.reason, r.context FROM triage.jobs j"
        " LEFT JOIN triage.manual_review r ON r.job_id = j.id ORDER BY j.external_id",
    )
    by_id = {r.external_id: r for r in rows}
    assert by_id["fine-1"].status == by_id["fine-2"].status == "completed"
    # the NUL id: its line is malformed, registered under its position, its bytes kept
    (position,) = [e for e in by_id if e.startswith("2026-11-01/export.jsonl:")]
    assert position == "2026-11-01/export.jsonl:2"
    assert (by_id[position].status, by_id[position].reason) == ("manual_review", "malformed_input")
    assert by_id[position].context["malformed_reason"] == "nul_in_id"
    # the NUL label: an unusable model output, like any other
    assert (by_id[NUL_LABEL_ID].status, by_id[NUL_LABEL_ID].reason) == ("manual_review", "rejected_output")
    assert by_id[NUL_LABEL_ID].context == {"rejected_reason": "label_not_storable"}  # rejected: no uncertainty
    assert dict(r._tuple() for r in all_rows(store, "SELECT external_id, label FROM triage.document_labels")) == {
        "fine-1": "billing",
        "fine-2": "shipping",
    }
