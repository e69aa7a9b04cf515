"""Four worker processes claiming from 10,000 jobs never take one job twice in one attempt."""

from __future__ import annotations

import multiprocessing as mp

import sqlalchemy as sa

from tests.ledger.helpers import new_jobs
from triage.database import DatabaseUrl, create_engine
from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import Complete, LabelWrite

BATCH = "concurrency"
JOBS = 10_000
WORKERS = 4


def _worker(url: str, name: str, queue: mp.Queue) -> None:
    engine = create_engine(DatabaseUrl.parse(url), pool_size=1)
    store = JobStore(engine)
    done = 0
    while True:
        claim = store.claim(batch_key=BATCH, step="classify", limit=50, lease_seconds=120, owner=name)
        if not claim.jobs:
            break
        store.record(claim, [Complete(j.id, j.attempt, LabelWrite("billing", 0.9, "v")) for j in claim.jobs])
        done += len(claim.jobs)
    engine.dispose()
    queue.put((name, done))


def test_concurrent_claims_never_double_take(store: JobStore, db_url: DatabaseUrl) -> None:
    docs = new_jobs(JOBS)
    for start in range(0, JOBS, 5000):
        store.register(docs[start : start + 5000], batch_key=BATCH, step="classify", max_attempts=3)
    ctx = mp.get_context("spawn")
    queue: mp.Queue = ctx.Queue()
    workers = [ctx.Process(target=_worker, args=(db_url.libpq(), f"w{i}", queue)) for i in range(WORKERS)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=300)
        assert w.exitcode == 0
    done = dict(queue.get(timeout=5) for _ in workers)
    assert sum(done.values()) == JOBS
    assert sum(1 for n in done.values() if n > 0) >= 2, f"work was not shared: {done}"
    with store.engine.connect() as conn:
        doubled = conn.execute(
            sa.text(
                "SELECT job_id, attempt, count(*) FROM triage.job_events WHERE to_status = 'running'"
                " GROUP BY job_id, attempt HAVING count(*) > 1"
            )
        ).all()
        completions = conn.execute(
            sa.text("SELECT count(*), count(DISTINCT job_id) FROM triage.job_events WHERE to_status = 'completed'")
        ).one()
        owners = conn.execute(
            sa.text("SELECT count(DISTINCT actor) FROM triage.job_events WHERE to_status = 'running'")
        ).scalar()
        labels = conn.execute(sa.text("SELECT count(*) FROM triage.document_labels")).scalar()
    assert doubled == []
    assert tuple(completions) == (JOBS, JOBS)
    assert owners == sum(1 for n in done.values() if n > 0)
    assert labels == JOBS
