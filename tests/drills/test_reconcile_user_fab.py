"""docker-compose's provisioning of reconcile_jobs' API user, on a real FabAuthManager deployment
(issue #13, item 1), without Docker: the metadata DB migrated with the FAB tables, an admin as
``_AIRFLOW_WWW_USER_CREATE`` makes one, then airflow-init's step (``python -m
triage_tools.deploy.reconcile_user fab``) before any Airflow service starts, then the API server,
scheduler and DAG processor (LocalExecutor here, Celery in compose: the same API calls).

The FAB provider is in the image (``apache-airflow[fab]``) and in the development requirements,
at the version of the image's constraints.
"""

from __future__ import annotations

import secrets
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ServerHomes
from tests.harness.airflow import (
    AirflowCli,
    HarnessError,
    RunningAirflow,
    airflow_cli,
    api_client,
    free_port,
    json_output,
    migrate_metadata,
    running_airflow,
    wait_for_first_run,
)
from tests.harness.deployment import fresh_databases, triage_airflow_env
from triage.database import DatabaseUrl
from triage_tools.deploy import reconcile_user

ROOT = Path(__file__).resolve().parents[2]
FAB = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"

pytestmark = pytest.mark.slow


@dataclass
class Fab:
    airflow: RunningAirflow
    admin_password: str
    jobs_url: DatabaseUrl
    cli: AirflowCli  # `airflow ARGS` in the running deployment's environment, Airflow imported once
    # airflow_api as the workers read it, until the next provision() replaces its password
    read_connection: dict[str, Any] | None = None

    def provision(self) -> subprocess.CompletedProcess[str]:
        self.read_connection = None
        return provision(self.airflow.env, self.base_url)

    @property
    def base_url(self) -> str:
        return self.airflow.base_url


def provision(env: dict[str, str], api_url: str) -> subprocess.CompletedProcess[str]:
    """airflow-init's step, as docker-compose.yaml runs it."""
    argv = [
        sys.executable,
        "-m",
        "triage_tools.deploy.reconcile_user",
        "fab",
        "--api-url",
        api_url,
        "--airflow",
        f"{sys.executable} -m airflow",
    ]
    done = subprocess.run(argv, env=env, cwd=ROOT, text=True, capture_output=True, check=False, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done


@pytest.fixture(scope="module")
def fab(pg_server: DatabaseUrl, template_db: str, server_homes: ServerHomes) -> Iterator[Fab]:
    with fresh_databases(pg_server, template_db, "fab") as (metadata_url, jobs_url):
        yield from _fab(pg_server, metadata_url, jobs_url, server_homes)


def _fab(
    pg_server: DatabaseUrl, metadata_url: DatabaseUrl, jobs_url: DatabaseUrl, server_homes: ServerHomes
) -> Iterator[Fab]:
    home = server_homes.make("fab")
    env = triage_airflow_env(pg_server, metadata_url, jobs_url, home, extra={"AIRFLOW__CORE__AUTH_MANAGER": FAB})
    env.pop("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS")
    try:
        migrate_metadata(env)  # Airflow's tables and FAB's (the auth manager's DB manager)
        admin_password = secrets.token_urlsafe(16)
        airflow_cli(
            env,
            "users",
            "create",
            "--role",
            "Admin",
            "--username",
            "admin",
            # One token in 64 starts with "-": as a separate argument argparse reads it as an option.
            f"--password={admin_password}",
            "--email",
            "admin@triage.invalid",
            "--firstname",
            "a",
            "--lastname",
            "b",
        )
        port = free_port()
        provision(env, f"http://127.0.0.1:{port}")  # before any service starts, as in compose
        with (
            running_airflow(env, ROOT / "dags", timeout=240, api_port=port) as airflow,
            # its log where test_the_password_is_in_no_output_and_no_log looks too
            AirflowCli(airflow.env, Path(airflow.env["AIRFLOW_HOME"]) / "harness-logs" / "cli.log") as cli,
        ):
            yield Fab(airflow, admin_password, jobs_url, cli)
    finally:
        server_homes.remove(home)


def token(fab: Fab, username: str, password: str) -> httpx.Response:
    return httpx.post(f"{fab.base_url}/auth/token", json={"username": username, "password": password}, timeout=60)


def client(fab: Fab, username: str, password: str) -> httpx.Client:
    return api_client(fab.base_url, username, password)


def connection(fab: Fab) -> dict[str, Any]:
    """The airflow_api connection as the workers read it (from the metadata DB, decrypted): one
    ``airflow connections get`` per provisioning, not per look."""
    if fab.read_connection is None:
        listed = json_output(fab.cli("connections", "get", reconcile_user.CONN_ID, "-o", "json").stdout)
        fab.read_connection = dict(listed[0])
    return fab.read_connection


def reconcile_client(fab: Fab) -> httpx.Client:
    return client(fab, reconcile_user.USERNAME, connection(fab)["password"])


def first_reconcile_run(fab: Fab) -> dict[str, Any]:
    with client(fab, "admin", fab.admin_password) as api:
        try:
            return wait_for_first_run(api, "reconcile_jobs", timeout=300)
        except HarnessError as exc:
            pytest.fail(f"{exc}\n{fab.airflow.logs()}")


def test_the_connection_names_the_user_and_the_api_server(fab: Fab) -> None:
    conn = connection(fab)
    assert conn["conn_type"] == "http"
    assert conn["host"] == fab.base_url
    assert conn["login"] == reconcile_user.USERNAME
    assert len(conn["password"]) >= 32


def test_the_role_has_the_three_read_permissions_and_nothing_else(fab: Fab) -> None:
    listed = json_output(fab.cli("roles", "list", "-p", "-o", "json").stdout)
    granted = {
        (action, row["resource"])
        for row in listed
        if row["name"] == reconcile_user.FAB_ROLE
        for action in row["action"].split(",")
    }
    # and the UI's home page, which FAB gives every custom role when the API server starts
    assert granted == {*reconcile_user.FAB_PERMISSIONS, *reconcile_user.FAB_GIVES_EVERY_ROLE}


def test_the_first_reconcile_run_checks_airflows_view(fab: Fab) -> None:
    run = first_reconcile_run(fab)
    assert run["state"] == "success", run
    assert run["run_type"] == "scheduled"
    with psycopg.connect(fab.jobs_url.libpq()) as conn:
        summary = conn.execute("SELECT summary FROM triage.reconciliation_runs ORDER BY id LIMIT 1").fetchone()
    assert summary is not None
    assert "airflow_view" in summary[0]["totals"]["checked"], summary[0]["totals"]


def test_the_user_reads_classify_documents_and_nothing_else(fab: Fab) -> None:
    with reconcile_client(fab) as api:
        assert api.get("/api/v2/dags/classify_documents/dagRuns").status_code == 200
        assert api.get("/api/v2/dags/classify_documents/dagRuns/~/taskInstances").status_code == 200
        assert api.get("/api/v2/dags/reconcile_jobs/dagRuns").status_code == 403  # another DAG's runs
        assert api.get("/api/v2/dags/review_jobs/dagRuns/~/taskInstances").status_code == 403
        trigger = api.post("/api/v2/dags/classify_documents/dagRuns", json={"logical_date": None})
        assert trigger.status_code == 403, trigger.text
        unpause = api.patch("/api/v2/dags/classify_documents", json={"is_paused": False})
        assert unpause.status_code == 403, unpause.text
        assert api.get("/api/v2/connections").status_code == 403
        assert api.get("/api/v2/variables").status_code == 403


def test_provisioning_again_keeps_the_role_and_replaces_the_password(fab: Fab) -> None:
    before = connection(fab)["password"]
    fab.provision()
    after = connection(fab)["password"]
    assert after != before
    assert token(fab, reconcile_user.USERNAME, before).status_code == 401
    assert token(fab, reconcile_user.USERNAME, after).status_code == 201
    test_the_role_has_the_three_read_permissions_and_nothing_else(fab)


def test_the_password_is_in_no_output_and_no_log(fab: Fab) -> None:
    done = fab.provision()
    password = connection(fab)["password"]
    assert password not in done.stdout + done.stderr
    logs = [p for p in Path(fab.airflow.env["AIRFLOW_HOME"]).rglob("*.log") if p.is_file()]
    assert [p for p in logs if password in p.read_text(errors="replace")] == []


def test_the_triage_pages_answer_as_fab_says(fab: Fab) -> None:
    """The Triage plugin behind FAB (compose's auth manager): Viewer may look, User may decide, a
    user who may not read review_jobs (reconcile_jobs' own) gets 403, nobody gets 401."""
    from tests.ledger.helpers import new_jobs
    from triage.database import create_engine
    from triage.jobs.store import JobStore
    from triage.jobs.vocabulary.models import ClassificationRecord, SendToReview

    engine = create_engine(fab.jobs_url)
    try:
        store = JobStore(engine)
        batch = "2026-10-09T00:00:00+00:00/2026-10-10T00:00:00+00:00"
        store.register(new_jobs(1, prefix="fab-review"), batch_key=batch, step="classify", max_attempts=3)
        claim = store.claim(batch_key=batch, step="classify", limit=1, lease_seconds=60, owner="test-worker")
        model = ClassificationRecord("billing", 0.4, "inconclusive", "keyword-v1")
        store.record(claim, [SendToReview(j.id, j.attempt, "inconclusive", classification=model) for j in claim.jobs])
        job_id = str(claim.jobs[0].id)
        passwords = {}
        for name, role in (("viewer", "Viewer"), ("editor", "User")):
            passwords[name] = secrets.token_urlsafe(16)
            fab.cli(
                "users",
                "create",
                "--role",
                role,
                "--username",
                name,
                f"--password={passwords[name]}",
                "--email",
                f"{name}@triage.invalid",
                "--firstname",
                name,
                "--lastname",
                "t",
            )
        assert httpx.get(f"{fab.base_url}/triage/api/reviews", timeout=60).status_code == 401
        with reconcile_client(fab) as api:
            # FAB's per-DAG rights exist once the DAG processor parsed review_jobs; until then the
            # plugin answers 503 + Retry-After (not yet known), never a 403 it would later revise.
            deadline = time.monotonic() + 120
            while (refused := api.get("/triage/api/reviews")).status_code == 503 and time.monotonic() < deadline:
                assert refused.headers["Retry-After"]
                time.sleep(1.0)
            assert refused.status_code == 403, refused.text  # may read classify_documents only
        decision = {"action": "label", "label": "shipping", "note": "fab"}
        with client(fab, "viewer", passwords["viewer"]) as api:
            assert api.get("/triage/api/reviews").json()["reviews"][0]["job_id"] == job_id
            assert api.post(f"/triage/api/reviews/{job_id}", json=decision).status_code == 403
        with client(fab, "editor", passwords["editor"]) as api:
            done = api.post(f"/triage/api/reviews/{job_id}", json=decision)
            assert done.status_code == 200, done.text
            assert done.json()["resolved_by"] == "editor"
        with engine.connect() as conn:
            actor = conn.exec_driver_sql(
                "SELECT actor FROM triage.job_events WHERE job_id = %s ORDER BY id DESC LIMIT 1", (job_id,)
            ).scalar_one()
        assert actor == "editor"
    finally:
        engine.dispose()
