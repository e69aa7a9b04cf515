"""Poison isolation: a document that kills its worker process takes only itself to review.

A real worker process (``tests/ledger/poison_worker.py``) claims the whole batch and
classifies it through the drill classifier, whose ``kill_on`` document SIGKILLs the process
mid-claim; nothing of that claim is recorded. Each death is followed by what reconciliation
does (its leases expire and :meth:`JobStore.release_expired_leases` takes them back) and a new
worker. The claims of the suspects halve, death after death, until the poison document dies
alone: it goes to review as ``poison`` and every other document completes.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.database import DatabaseUrl
from triage.jobs.store import JobStore

ROOT = Path(__file__).resolve().parents[2]
BATCH = "poison-batch"
N = 200
POISON = "doc-137"


def run_worker(db_url: DatabaseUrl, kill_on: str) -> int:
    env = {
        **os.environ,
        "TRIAGE_DATABASE_URL": db_url.libpq(),
        "PYTHONPATH": os.pathsep.join([str(ROOT / "plugins"), str(ROOT)]),
    }
    done = subprocess.run(
        [sys.executable, "-m", "tests.ledger.poison_worker", BATCH, kill_on],
        cwd=ROOT,
        env=env,
        timeout=120,
        check=False,
    )
    return done.returncode


def rows(store: JobStore, sql: str) -> list[tuple[object, ...]]:
    with store.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(sa.text(sql)).all()]


def test_only_the_poison_document_ends_in_review(store: JobStore, db_url: DatabaseUrl) -> None:
    store.register(new_jobs(N), batch_key=BATCH, step="classify", max_attempts=3)
    deaths = 0
    bound = math.ceil(math.log2(N)) + 2
    while (code := run_worker(db_url, POISON)) != 0:
        assert code == -signal.SIGKILL, f"the worker failed otherwise: exit {code}"
        deaths += 1
        assert deaths <= bound, f"more than {bound} worker deaths for one poison document in {N}"
        # What reconcile_jobs does once the dead claim's lease has run out.
        with store.engine.begin() as conn:
            conn.execute(
                sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")
            )
        store.release_expired_leases()
    assert deaths >= 2  # the first claim took the whole batch down with it
    assert rows(store, "SELECT status::text, count(*) FROM triage.jobs GROUP BY 1 ORDER BY 1") == [
        ("completed", N - 1),
        ("manual_review", 1),
    ]
    assert rows(
        store,
        "SELECT j.external_id, j.status_reason, r.reason FROM triage.jobs j"
        " JOIN triage.manual_review r ON r.job_id = j.id AND r.resolved_at IS NULL",
    ) == [(POISON, "poison", "poison")]
    # No neighbour was charged for the poison's deaths: each shared death grew its budget by the
    # attempt it cost, so each completed with its whole budget but the completing attempt left.
    assert rows(store, "SELECT DISTINCT max_attempts - attempt FROM triage.jobs WHERE status = 'completed'") == [(2,)]
    assert rows(store, "SELECT max(attempt) > 1 FROM triage.jobs WHERE status = 'completed'") == [(True,)]
    # Every claim of the isolation was a halving: the poison's rescues are the deaths.
    assert rows(store, f"SELECT lease_rescues FROM triage.jobs WHERE external_id = '{POISON}'") == [(deaths,)]
    # The log says what happened, move by move.
    assert rows(
        store,
        "SELECT e.reason, e.actor FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
        f" WHERE j.external_id = '{POISON}' AND e.to_status = 'manual_review'",
    ) == [("poison", "reconciliation")]


def test_clean_claims_never_mix_with_suspects(store: JobStore) -> None:
    store.register(new_jobs(10), batch_key=BATCH, step="classify", max_attempts=3)
    first = store.claim(batch_key=BATCH, step="classify", limit=6, lease_seconds=60, owner="w/1")
    with store.engine.begin() as conn:
        conn.execute(
            sa.text("UPDATE triage.jobs SET lease_expires_at = now() - interval '1 s' WHERE status = 'running'")
        )
    assert store.release_expired_leases().retrying == 6
    dead = {j.id for j in first.jobs}
    # Six suspects (cap 3) and four clean jobs: suspects first, three at a time, alone.
    sizes = []
    while claim := store.claim(batch_key=BATCH, step="classify", limit=100, lease_seconds=60, owner="w/2").jobs:
        ids = {j.id for j in claim}
        assert ids <= dead or not ids & dead, "a claim mixed suspects with clean jobs"
        sizes.append((len(ids), ids <= dead))
    assert sizes == [(3, True), (3, True), (4, False)]
