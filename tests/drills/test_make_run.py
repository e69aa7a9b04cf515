"""``make run`` end to end, as a user sees it (issue #12, item 5): what ``.venv/bin/triage run``
prints off a terminal for a small day is a few progress lines and the summary, at most ~60 lines
in all; Airflow's own output (some 600 lines) is in the log file whose path it prints first.

Real embedded PostgreSQL (the test server: a metadata database and a migrated job database of
this module's), real ``airflow db migrate`` and ``airflow dags test`` in the tools' children.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.conftest import ServerHomes
from triage.database import DatabaseUrl

ROOT = Path(__file__).resolve().parents[2]
LINE_BUDGET = 60  # what the issue allows once the virtualenv exists

pytestmark = pytest.mark.slow  # airflow db migrate and two dags test runs


@pytest.fixture(scope="module")
def checkout_env(pg_server: DatabaseUrl, template_db: str, server_homes: ServerHomes) -> Iterator[dict[str, str]]:
    """A user's environment with TRIAGE_DATABASE_URL (and Airflow's metadata DB) on the test
    server, and a TRIAGE_HOME of its own: the make targets' setting, minus the embedded server."""
    suffix = uuid.uuid4().hex[:10]
    metadata_db, jobs_db = f"airflow_run_{suffix}", f"triage_run_{suffix}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{metadata_db}"')
        conn.execute(f'CREATE DATABASE "{jobs_db}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
    home = server_homes.make("make-run")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_"))}
    env.update(
        PYTHONPATH=str(ROOT / "plugins"),
        TRIAGE_HOME=str(home),
        TRIAGE_DATABASE_URL=pg_server.with_database(jobs_db).libpq(),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=pg_server.with_database(metadata_db).airflow_metadata_url(),
    )
    try:
        yield env
    finally:
        with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{metadata_db}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "{jobs_db}" WITH (FORCE)')
        server_homes.remove(home)


def triage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/triage ARGS``: the console script's entry (``triage_tools.cli:main``), in a child
    whose output is a pipe, as in CI."""
    return subprocess.run(
        [sys.executable, "-m", "triage_tools", *args],
        env=env,
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=900,
    )


def test_make_run_prints_progress_and_the_summary_and_keeps_airflow_in_a_file(checkout_env: dict[str, str]) -> None:
    done = triage(checkout_env, "run", "--date", "2026-11-01", "--conf", '{"documents": 200}')

    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    lines = output.splitlines()
    assert len(lines) <= LINE_BUDGET, output
    [logged] = [line for line in lines if line.startswith("Airflow's output: ")]
    log = Path(logged.removeprefix("Airflow's output: "))
    assert log.parent == Path(checkout_env["TRIAGE_HOME"]) / "logs"
    airflow = log.read_text()
    assert "==> airflow dags test classify_documents 2026-11-02" in airflow
    assert "==> airflow dags test reconcile_jobs" in airflow
    assert len(airflow.splitlines()) > 3 * LINE_BUDGET  # what the screen is spared
    # Airflow's log lines are in the file only: no task log line reached the screen.
    assert not [line for line in lines if re.match(r"^\[?\d{4}-\d\d-\d\d[T ]\d\d:\d\d", line)], output
    progress = [line for line in lines if line.startswith(("classify_documents  ", "reconcile_jobs  "))]
    assert progress, output
    assert re.search(r" 200 jobs: .*completed \d+", progress[-1]), progress
    assert "classify_documents for 2026-11-01: succeeded" in lines
    assert "batch 2026-11-01T00:00:00+00:00/2026-11-02T00:00:00+00:00: 200 jobs" in output
    assert any(line.startswith("reconciliation report: ") for line in lines), output


def test_an_outage_past_every_retry_fails_the_run_and_the_next_run_of_the_date_heals_it(
    checkout_env: dict[str, str],
) -> None:
    """Issue #13's done-when, through ``make run``: the model down for the whole run (every call
    fails, past all of classify's retries) fails the run and sends no job to review; the next
    run of the date, the model back, completes every job. The injected failures carry a
    ``Retry-After`` of 1 s so that classify's retry policy keeps the retries short here."""
    outage = '{"documents": 60, "drill": {"transient_error_rate": 1.0, "retry_after_seconds": 1}}'
    failed = triage(checkout_env, "run", "--date", "2026-11-03", "--conf", outage)
    assert failed.returncode != 0, failed.stdout + failed.stderr
    assert "classify_documents for 2026-11-03: FAILED" in failed.stdout + failed.stderr
    batch = "2026-11-03T00:00:00+00:00/2026-11-04T00:00:00+00:00"
    query = (
        "SELECT j.status::text, j.status_reason, j.attempt, count(*) FROM triage.jobs j WHERE j.batch_key = %s"
        " GROUP BY 1, 2, 3"
    )
    with psycopg.connect(checkout_env["TRIAGE_DATABASE_URL"]) as conn:
        parked = conn.execute(query, (batch,)).fetchall()
        reviews = conn.execute(
            "SELECT count(*) FROM triage.manual_review r JOIN triage.jobs j ON j.id = r.job_id WHERE j.batch_key = %s",
            (batch,),
        ).fetchone()
    assert parked == [("waiting", "outage:model", 0, 60)]
    assert reviews == (0,)

    healed = triage(checkout_env, "run", "--date", "2026-11-03", "--conf", '{"documents": 60}')
    assert healed.returncode == 0, healed.stdout + healed.stderr
    with psycopg.connect(checkout_env["TRIAGE_DATABASE_URL"]) as conn:
        settled = {(status, reason, attempt): n for status, reason, attempt, n in conn.execute(query, (batch,))}
    # Every job settled on its first attempt; a review is the keyword classifier's own doubt
    # about a document (inconclusive), never the outage.
    assert set(settled) <= {("completed", "completed", 1), ("manual_review", "inconclusive", 1)}, settled
    assert sum(settled.values()) == 60
