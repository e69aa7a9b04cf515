"""A job is labelled only by the classifier version it was registered for: the claim itself
takes only the running classifier's version. The others stay as they are for a run of their
version, and reconciliation reports those no configured classifier has (``version_mismatch``)."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from tests.ledger.helpers import new_jobs
from triage.classifiers import KeywordClassifier, Taxonomy
from triage.contracts.documents import DocumentPayload
from triage.jobs.sql.moves import worker as T
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import RetryLater
from triage.payloads import PayloadStore
from triage.pipeline.classify import ClassifyHandler, ClassifySettings
from triage.pipeline.retrieve import to_new_jobs
from triage.pipeline.steps import RunSettings, run_step
from triage.reconciliation import rules
from triage.reconciliation.params import ReconcileParams
from triage.sources.base import SourceDocument

BATCH = "2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00"
OLD = "keyword-v1+tax-00000000"  # registered under a taxonomy that has changed since


def rows(store: JobStore, sql: str, **params: object) -> list[tuple[Any, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql), params)]


def claim(store: JobStore, version: str | None, limit: int = 100) -> set[str]:
    got = store.claim(
        batch_key=BATCH, step="classify", limit=limit, lease_seconds=60, owner="w", classifier_version=version
    )
    return {j.classifier_version for j in got.jobs}


@pytest.mark.parametrize(
    ("version", "claimed"),
    [
        pytest.param("v-a", {"v-a"}, id="a-claims-a"),
        pytest.param("v-b", {"v-b"}, id="b-claims-b"),
        pytest.param("v-c", set(), id="c-claims-nothing"),
        pytest.param(None, {"v-a", "v-b"}, id="no-classifier-any"),
    ],
)
def test_a_claim_takes_only_its_classifiers_version(store: JobStore, version: str | None, claimed: set[str]) -> None:
    for v in ("v-a", "v-b"):
        store.register(new_jobs(3, prefix=v, version=v), batch_key=BATCH, step="classify", max_attempts=3)
    assert claim(store, version) == claimed
    expected_running = 6 if version is None else len(claimed) * 3
    assert rows(store, "SELECT count(*) FROM triage.jobs WHERE status = 'running'") == [(expected_running,)]


def register(store: JobStore, payloads: PayloadStore, version: str, prefix: str, n: int) -> list[uuid.UUID]:
    docs = [
        SourceDocument(
            "test",
            f"{prefix}-{i}",
            DocumentPayload(
                external_id=f"{prefix}-{i}",
                subject="Invoice",
                body="I was charged twice",
                received_at=datetime(2026, 11, 1, 9, tzinfo=UTC),
            ).to_bytes(),
        )
        for i in range(n)
    ]
    new = to_new_jobs(docs, payloads, version)
    return list(store.register(new, batch_key=BATCH, step="classify", max_attempts=3).new_ids)


@pytest.mark.own_database  # run_step records on a thread of its own beside its claims
def test_a_run_of_another_version_leaves_the_jobs_of_a_version_untouched(store: JobStore, tmp_path: Path) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    current = KeywordClassifier(Taxonomy.load())
    old_ids = register(store, payloads, OLD, "old", 4)
    # one old job failed transiently and is due again now: not this run's to retry either
    got = store.claim(batch_key=BATCH, step="classify", limit=1, lease_seconds=60, owner="old-run")
    store.record(got, [RetryLater(got.jobs[0].id, got.jobs[0].attempt, "server_error", delay_seconds=0)])
    new_ids = register(store, payloads, current.version, "new", 3)
    before = rows(
        store,
        "SELECT id, status, attempt, updated_at FROM triage.jobs WHERE classifier_version = :v ORDER BY id",
        v=OLD,
    )

    handler = ClassifyHandler(current, payloads, ClassifySettings(confidence_threshold=0.0))
    try:
        report = run_step(store, handler, batch_key=BATCH, settings=RunSettings(owner="new-run", retry_soon_seconds=5))
    finally:
        handler.close()

    assert report.claimed == 3  # the run ends: the old version's due retry is not waited for
    assert (
        rows(
            store,
            "SELECT id, status, attempt, updated_at FROM triage.jobs WHERE classifier_version = :v ORDER BY id",
            v=OLD,
        )
        == before
    )
    assert rows(
        store, "SELECT count(*) FROM triage.job_events WHERE job_id = ANY(:ids) AND actor = 'new-run'", ids=old_ids
    ) == [(0,)]
    labelled = rows(store, "SELECT job_id, classifier_version FROM triage.document_labels")
    assert sorted(labelled) == sorted((i, current.version) for i in new_ids)
    assert {v for (v,) in rows(store, "SELECT classifier_version FROM triage.classifications")} == {current.version}

    # Reconciliation names them: no classifier of the deployment has their version.
    params = ReconcileParams(grace_seconds=0)
    found = {f.check: f for f in rules.stuck_work(store, params, {current.version, "llm:m:p1:t0.0+tax-1"}).findings}
    assert found["version_mismatch"].count == 4
    assert set(found["version_mismatch"].job_ids) == {str(i) for i in old_ids}
    assert "version_mismatch" not in {f.check for f in rules.stuck_work(store, params, {OLD}).findings}
    assert "version_mismatch" not in {f.check for f in rules.stuck_work(store, params).findings}


@pytest.mark.parametrize("versioned", [pytest.param(False, id="any-version"), pytest.param(True, id="one-version")])
def test_the_claim_plan_reads_the_partial_claim_index(store: JobStore, versioned: bool) -> None:
    for v in ("v-a", "v-b"):
        store.register(new_jobs(2000, prefix=v, version=v), batch_key=BATCH, step="classify", max_attempts=3)
    with store.engine.begin() as conn:
        conn.execute(sa.text("ANALYZE triage.jobs"))
    statement = T.claim_batch(versioned=versioned).compile(dialect=postgresql.dialect())
    params = statement.construct_params(
        {
            "p_batch_key": BATCH,
            "p_step": "classify",
            "limit": 100,
            "lease_seconds": 60.0,
            "owner": "w",
            "token": uuid.uuid4(),
            "p_classifier_version": "v-b",
        }
    )
    with store.engine.connect() as conn, conn.begin() as txn:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]  # an open connection has its DBAPI one
        cursor.execute("EXPLAIN (FORMAT JSON) " + str(statement), params)
        row = cursor.fetchone()
        assert row is not None
        document = row[0]
        txn.rollback()
    plan = json.dumps(json.loads(document) if isinstance(document, str) else document)
    assert "jobs_claimable_idx" in plan
