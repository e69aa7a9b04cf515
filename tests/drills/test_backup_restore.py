"""Backup and restore (docs/operations.md): a dump of a ledger in the middle of a run, taken
while a worker keeps completing jobs, restored into a fresh PostgreSQL with the roles first,
then reconciled: it agrees, finding only what a restore must leave (the dead run's leases,
events the dump saw unsent, the payloads copied after the dump all there).
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage import migrations
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import ClassificationRecord, Complete, LabelWrite, NewJob, SendToReview
from triage.payloads import PayloadStore
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.runner import reconcile
from triage_tools import embedded

pytestmark = pytest.mark.slow

VERSION = new_jobs(1)[0].classifier_version
LABEL = LabelWrite("billing", 0.9, VERSION)
ANSWER = ClassificationRecord("billing", 0.9, "accepted", VERSION)
# What a restore of a ledger mid-run may find, and nothing else: the leases of the run the dump
# caught (its workers are gone), the events it saw unsent, and that run's unclaimed jobs.
EXPECTED = {"lease_expired", "outbox_lag", "stuck_queued", "orphaned"}
CONSISTENCY = {
    "review_row_missing",
    "review_open_for_terminal_job",
    "completed_without_event",
    "completed_without_label",
    "label_without_completed_job",
    "review_open_for_active_job",
}


def _tool(name: str) -> str:
    return str(embedded.bin_dir() / name)


def _register(store: JobStore, payloads: PayloadStore, batch: str, n: int) -> None:
    docs = new_jobs(n, prefix=batch)
    refs = payloads.put_many([f"document {batch}-{i}".encode() for i in range(n)])
    store.register(
        [
            NewJob(d.idempotency_key, d.source, d.external_id, sha, ref, d.classifier_version)
            for d, (sha, ref) in zip(docs, refs, strict=True)
        ],
        batch_key=batch,
        step="classify",
        max_attempts=3,
    )


def _complete_some(store: JobStore, batch: str, n: int, lease_seconds: int = 60) -> int:
    claim = store.claim(
        batch_key=batch, step="classify", limit=n, lease_seconds=lease_seconds, owner="t", classifier_version=VERSION
    )
    store.record(claim, [Complete(j.id, j.attempt, LABEL, ANSWER) for j in claim.jobs])
    return len(claim.jobs)


def _counts(url: DatabaseUrl) -> dict[str, Any]:
    engine = create_engine(url, poolclass=sa.NullPool)
    with engine.connect() as conn:
        out = {
            "by_state": dict(
                conn.execute(sa.text("SELECT status::text, count(*) FROM triage.jobs GROUP BY 1")).tuples().all()
            ),
            "events": conn.execute(sa.text("SELECT count(*) FROM triage.job_events")).scalar(),
            "outbox": conn.execute(
                sa.text(
                    "SELECT count(*), count(*) FILTER (WHERE (txid, event_id) <= (SELECT txid, event_id FROM triage.outbox_watermark)) FROM triage.outbox"
                )
            )
            .one()
            ._tuple(),
            "labels": conn.execute(sa.text("SELECT count(*) FROM triage.document_labels")).scalar(),
            "reviews": conn.execute(sa.text("SELECT count(*) FROM triage.manual_review")).scalar(),
            "partitions": conn.execute(
                sa.text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'triage.job_events'::regclass")
            ).scalar(),
        }
    engine.dispose()
    return out


def test_a_dump_of_a_running_ledger_restores_into_a_fresh_server_and_reconciles(
    db_url: DatabaseUrl, engine: sa.Engine, store: JobStore, server_home: Path, tmp_path: Path
) -> None:
    payloads = PayloadStore(tmp_path / "payloads")
    # Mid-run: a finished batch, a batch half done with leases held by a worker that will die,
    # a job in review, events partly published; a worker still completing jobs during the dump.
    _register(store, payloads, "done", 200)
    while _complete_some(store, "done", 50):
        pass
    _register(store, payloads, "running", 400)
    _complete_some(store, "running", 100)
    store.claim(
        batch_key="running", step="classify", limit=50, lease_seconds=1, owner="dying", classifier_version=VERSION
    )
    claim = store.claim(
        batch_key="running", step="classify", limit=1, lease_seconds=60, owner="t", classifier_version=VERSION
    )
    store.record(claim, [SendToReview(claim.jobs[0].id, claim.jobs[0].attempt, "inconclusive")])
    store.relay(lambda events: None, limit=300)

    # The worker that commits during the dump works a batch of its own: on "running" its claims
    # took the dying worker's jobs once their 1 s leases expired under a slow pg_dump (a flake:
    # lease_expired 0, not 50).
    _register(store, payloads, "busy", 200)
    stop = threading.Event()

    def worker() -> None:
        while not stop.is_set() and _complete_some(store, "busy", 5):
            pass

    busy = threading.Thread(target=worker)
    busy.start()
    dump = tmp_path / "triage.dump"
    roles = tmp_path / "roles.sql"
    try:
        subprocess.run([_tool("pg_dump"), "--format=custom", f"--file={dump}", db_url.libpq()], check=True)
    finally:
        stop.set()
        busy.join()
    server = db_url.with_database("postgres")
    subprocess.run([_tool("pg_dumpall"), "--roles-only", f"--file={roles}", f"--dbname={server.libpq()}"], check=True)
    # The payloads after the database: everything the dump references was on disk before its
    # job committed (retrieval writes a pack, then registers).
    copied = tmp_path / "restored-payloads"
    subprocess.run(["cp", "-a", str(tmp_path / "payloads"), str(copied)], check=True)
    source = _counts(db_url)

    fresh = embedded.start(server_home, databases=())
    # Roles first (they are the cluster's, not the dump's): a role that exists already is an
    # error psql reports and passes over.
    subprocess.run([_tool("psql"), "--quiet", f"--file={roles}", fresh.libpq()], check=True, capture_output=True)
    with psycopg.connect(fresh.libpq(), autocommit=True) as admin:
        admin.execute("CREATE DATABASE triage")
    restored = fresh.with_database("triage")
    subprocess.run([_tool("pg_restore"), "--exit-on-error", f"--dbname={restored.libpq()}", str(dump)], check=True)

    assert migrations.current_revision(restored) == migrations.current_revision(db_url)
    after = _counts(restored)
    assert after["partitions"] == source["partitions"]
    # The dump is one snapshot: the worker's commits after it are not in it (and no partial one is).
    assert sum(after["by_state"].values()) == sum(source["by_state"].values())

    restored_engine = create_engine(restored, pool_size=2)
    try:
        restored_store = JobStore(restored_engine)
        outcome = reconcile(restored_store, ReconcileParams(grace_seconds=0), reports_dir=None)
        found = {f.check: f.count for r in outcome.results for f in r.findings}
        assert not set(found) & CONSISTENCY, found
        assert set(found) <= EXPECTED, found
        assert found.get("lease_expired") == 50  # the dying worker's claim
        # The restored ledger works: its triggers log a move, its sequences go on, the payloads read.
        while _complete_some(restored_store, "running", 100):
            pass
        with restored_engine.connect() as conn:
            ref, sha = conn.execute(
                sa.text("SELECT payload_ref, content_sha256 FROM triage.jobs WHERE status = 'completed' LIMIT 1")
            ).one()
            unique_ids = conn.execute(sa.text("SELECT count(*) = count(DISTINCT id) FROM triage.job_events")).scalar()
        assert unique_ids
        assert PayloadStore(copied).get(ref.replace(payloads.prefix, PayloadStore(copied).prefix), sha)
        again = reconcile(restored_store, ReconcileParams(grace_seconds=0), reports_dir=None)
        assert not {f.check for r in again.results for f in r.findings} & CONSISTENCY
    finally:
        restored_engine.dispose()
