"""The rows a chunk writes (issue #29, the classify step's client CPU): its row sets are encoded
by msgspec (:func:`triage.jobs.store.recording.plain_rowset`) and a classification row leaves
its nulls out (:func:`triage.jobs.store.recording.without_nulls`), where ``json.dumps`` wrote
every column. ``json_to_recordset`` must read both alike: the same rows in every table the
chunk writes, for every kind of outcome a chunk records (accepted with candidates, an audit
sample, a reused answer, a model's usage and a figure out of bounds, inconclusive, rejected, a
malformed payload), text beyond ASCII and floats written with an exponent included.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.jobs.sql.expressions import rowset
from triage.jobs.sql.moves import one_transaction as M
from triage.jobs.store import JobStore, one_transaction, recording
from triage.jobs.store.one_transaction import _pick, record_picked_txn
from triage.jobs.vocabulary.models import (
    ClaimedJob,
    ClassificationRecord,
    Complete,
    LabelWrite,
    Outcome,
    SendToReview,
)

VERSION = "keyword-v1"

# What each table holds of the picked jobs, as JSON, less what differs between two writes of the
# same outcomes by design: the events' ids (drawn at each write) and the rows' serial ids.
SNAPSHOT = {
    "jobs": "SELECT to_jsonb(t) FROM triage.jobs t WHERE id = ANY(:ids) ORDER BY id",
    "job_events": "SELECT to_jsonb(t) - 'id' FROM triage.job_events t WHERE job_id = ANY(:ids) ORDER BY job_id, id",
    "outbox": "SELECT to_jsonb(t) - 'event_id' FROM triage.outbox t WHERE job_id = ANY(:ids)"
    " ORDER BY job_id, event_type",
    "classifications": "SELECT to_jsonb(t) - 'id' FROM triage.classifications t WHERE job_id = ANY(:ids)"
    " ORDER BY job_id",
    "document_labels": "SELECT to_jsonb(t) FROM triage.document_labels t WHERE job_id = ANY(:ids) ORDER BY job_id",
    "manual_review": "SELECT to_jsonb(t) - 'id' FROM triage.manual_review t WHERE job_id = ANY(:ids) ORDER BY job_id",
}


def record(
    job: ClaimedJob,
    label: str | None,
    confidence: float | None,
    outcome: str,
    **more: Any,
) -> ClassificationRecord:
    return ClassificationRecord(label, confidence, outcome, VERSION, input_sha256="ab" * 32, **more)  # type: ignore[arg-type]


def outcomes_of(jobs: tuple[ClaimedJob, ...]) -> list[Outcome]:
    """One outcome of each kind a chunk records, for seven picked jobs."""
    j = jobs
    accepted = record(
        j[0], "billing", 0.91, "accepted", latency_ms=0.0123, candidates=(("billing", 0.91), ("refund_request", 0.05))
    )
    return [
        Complete(j[0].id, j[0].attempt, LabelWrite("billing", 0.91, VERSION), accepted),
        Complete(  # an audit sample, its figures written with an exponent by one encoder and not the other
            j[1].id,
            j[1].attempt,
            LabelWrite("shipping", 0.7, VERSION),
            record(j[1], "shipping", 0.7, "accepted", latency_ms=1e-05, candidates=(("shipping", 0.7),)),
            audit=True,
        ),
        Complete(  # a reused answer: no latency, an output mode, the answer it copied
            j[2].id,
            j[2].attempt,
            LabelWrite("billing", 1.0, VERSION),
            record(j[2], "billing", 1.0, "accepted", output_mode="json_schema", reused_from=(j[0].id, 1)),
        ),
        Complete(  # a model's usage, one figure out of its column's bounds
            j[3].id,
            j[3].attempt,
            LabelWrite("bug_report", 0.8, VERSION),
            record(
                j[3],
                "bug_report",
                0.8,
                "accepted",
                latency_ms=812.5,
                prompt_tokens=1200,
                completion_tokens=7,
                cost_usd=2e6,
                usage_discarded="completion_tokens_details",
            ),
        ),
        SendToReview(
            j[4].id,
            j[4].attempt,
            "inconclusive",
            "inconclusive",
            None,
            context={"label": "refund_request", "confidence": 0.4, "threshold": 0.7},
            classification=record(
                j[4],
                "refund_request",
                0.4,
                "inconclusive",
                latency_ms=0.02,
                candidates=(("refund_request", 0.4), ("billing", 0.35)),
            ),
        ),
        SendToReview(
            j[5].id,
            j[5].attempt,
            "rejected_output",
            "label_outside_taxonomy",
            None,
            context={"rejected_reason": "label_outside_taxonomy"},
            classification=record(j[5], None, 0.0, "rejected", rejected_reason="label_outside_taxonomy"),
        ),
        SendToReview(  # a malformed payload: no classification; its error beyond ASCII
            j[6].id,
            j[6].attempt,
            "malformed_input",
            "invalid_json",
            "invalid_json: « ü »",
            context={"malformed_reason": "invalid_json"},
        ),
    ]


def written(conn: sa.Connection, jobs: tuple[ClaimedJob, ...], outcomes: list[Outcome]) -> dict[str, list[Any]]:
    """What recording ``outcomes`` writes, read back; then undone (a savepoint)."""
    with conn.begin_nested() as nested:
        recorded = record_picked_txn(conn, jobs, outcomes)
        assert (recorded.completed, recorded.to_review) == (4, 3)
        ids = [j.id for j in jobs]
        found = {table: [r[0] for r in conn.execute(sa.text(sql), {"ids": ids})] for table, sql in SNAPSHOT.items()}
        nested.rollback()
    return found


def test_a_chunk_writes_the_rows_json_dumps_with_every_column_wrote(
    store: JobStore, ledger: sa.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    store.register(new_jobs(7), batch_key="b", step="classify", max_attempts=3)
    params = {"p_batch_key": "b", "p_step": "classify", "p_classifier_version": VERSION, "limit": 7}
    jobs = _pick(ledger, params)  # psycopg's rows, not SQLAlchemy's: the same jobs
    assert jobs == tuple(ClaimedJob(*row) for row in ledger.execute(M.pick_chunk(), params).all())
    assert len(jobs) == 7
    outcomes = outcomes_of(jobs)

    now = written(ledger, jobs, outcomes)
    with monkeypatch.context() as before:  # the encoding before issue #29's cut: json.dumps, nulls and all
        before.setattr(recording, "plain_rowset", rowset)
        before.setattr(one_transaction, "plain_rowset", rowset)
        before.setattr(recording, "without_nulls", dict)
        then = written(ledger, jobs, outcomes)

    assert now == then
    # The snapshot holds what the cases are about (a comparison of two empty tables proves nothing).
    assert {len(rows) for rows in (now["jobs"], now["outbox"], now["job_events"])} == {7, 14}
    by_job = {uuid.UUID(c["job_id"]): c for c in now["classifications"]}
    assert sorted(by_job) == sorted(j.id for j in jobs[:6]), "the malformed payload has no classification"
    assert by_job[jobs[1].id]["latency_ms"] == 1e-05
    assert (by_job[jobs[2].id]["reused_job_id"], by_job[jobs[2].id]["latency_ms"]) == (str(jobs[0].id), None)
    assert (by_job[jobs[3].id]["cost_usd"], by_job[jobs[3].id]["prompt_tokens"]) == (None, 1200)
    assert by_job[jobs[3].id]["usage_discarded"] == "completion_tokens_details,cost_usd"
    assert (by_job[jobs[5].id]["label"], by_job[jobs[5].id]["rejected_reason"]) == (None, "label_outside_taxonomy")
    assert by_job[jobs[0].id]["candidates"] == [
        {"label": "billing", "score": 0.91},
        {"label": "refund_request", "score": 0.05},
    ]
    assert {r["label"] for r in now["document_labels"]} == {"billing", "shipping", "bug_report"}
    assert sorted(r["reason"] for r in now["manual_review"]) == [
        "audit_sample",
        "inconclusive",
        "malformed_input",
        "rejected_output",
    ]
