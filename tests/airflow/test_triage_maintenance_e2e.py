"""triage_maintenance end to end through ``airflow dags test``, as the maintenance role's login
(``triage_db_maintenance``; the pipeline's ``triage_db`` may not run retention): it makes the
coming days' partitions, rotates the event file and removes an expired rotated one, keeping the
ledger's rows (none expired in a fresh database), and returns what it removed per kind."""

from __future__ import annotations

import os
import time

from tests.harness.deployment import Deployment
from tests.ledger.helpers import new_jobs
from triage.jobs.store import JobStore

BATCH = "2026-11-10T00:00:00+00:00/2026-11-11T00:00:00+00:00"


def test_triage_maintenance_runs_as_the_dags_role_and_removes_only_what_expired(deployment: Deployment) -> None:
    engine = deployment.engine()
    JobStore(engine).register(new_jobs(3, prefix="maint"), batch_key=BATCH, step="classify", max_attempts=3)
    engine.dispose()
    events = deployment.home / "events"
    events.mkdir(parents=True, exist_ok=True)
    (events / "outbox.jsonl").write_text('{"event_id": "live"}\n')
    expired = events / "outbox.jsonl.20261001T000000Z"
    expired.write_text("{}\n")
    long_ago = time.time() - 30 * 86400
    os.utime(expired, (long_ago, long_ago))
    partitions = "SELECT count(*) FROM pg_inherits WHERE inhparent = 'triage.job_events'::regclass"
    before = deployment.scalar(partitions)

    run = deployment.dags_test("triage_maintenance", "2026-11-30T00:00:00+00:00")

    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-4000:]
    log = run.stdout + run.stderr
    assert "retention applied" in log
    assert "event_files: removed 1" in log
    assert not expired.exists()
    assert not (events / "outbox.jsonl").exists()  # rotated: the sink makes a new one
    assert [p.name for p in events.iterdir() if p.name.startswith("outbox.jsonl.")] != []
    assert deployment.scalar(partitions) >= before  # the days ahead exist (made now or by the migration)
    assert deployment.scalar("SELECT count(*) FROM triage.jobs") == 3
    assert deployment.scalar("SELECT count(*) FROM triage.job_events") == 3
