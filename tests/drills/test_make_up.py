"""``make up`` as a user starts it (issue #13, item 1): the backstop is on without anyone
touching it, and its cross-check with Airflow's own task states runs as a user of its own; and
(issue #15) documents posted with ``curl`` are classified by ``classify_intake`` within two
minutes, nobody triggering a DAG.

``triage up`` in a child (``make up``'s command: prepare, then ``airflow standalone`` with its
API server, scheduler, DAG processor and triggerer) on the test server (a fresh metadata
database and a migrated job database of this module's, as with ``TRIAGE_DATABASE_URL``) and on
ports of its own beside any ``make up`` on 8080. Then, without triggering anything:
``./airflow.sh dags list`` shows ``reconcile_jobs`` unpaused and ``classify_documents`` paused;
the scheduler runs ``reconcile_jobs`` by itself and its first run's report (the XCom, the stored
run, the HTML page) shows the Airflow view checked; ``triage_reconcile`` reads runs and may not
trigger, unpause or read connections; its password is in no output and no log.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from tests.conftest import ServerHomes
from tests.harness.airflow import HarnessError, api_client, free_port, wait_for_first_run
from tests.harness.deployment import fresh_databases
from triage.database import DatabaseUrl
from triage_tools.deploy import reconcile_user

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # airflow standalone and a scheduled run


@dataclass
class Up:
    env: dict[str, str]  # the user's environment of the make targets
    airflow_env: dict[str, str]  # with AIRFLOW_HOME, as the tools compute it
    base_url: str
    output: str  # what `triage up` printed
    jobs_url: DatabaseUrl


def triage(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``.venv/bin/triage ARGS`` (``triage_tools.cli``) from this checkout."""
    return subprocess.run(
        [sys.executable, "-m", "triage_tools", *args],
        env=env,
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def up(pg_server: DatabaseUrl, template_db: str, server_homes: ServerHomes) -> Iterator[Up]:
    with fresh_databases(pg_server, template_db, "up") as (metadata_url, jobs_url):
        yield from _up(metadata_url, jobs_url, server_homes)


def _up(metadata_url: DatabaseUrl, jobs_url: DatabaseUrl, server_homes: ServerHomes) -> Iterator[Up]:
    home = server_homes.make("make-up")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "TRIAGE_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT / "plugins"), *filter(None, [os.environ.get("PYTHONPATH")])]),
        TRIAGE_HOME=str(home),
        TRIAGE_DATABASE_URL=jobs_url.libpq(),
        AIRFLOW__DATABASE__SQL_ALCHEMY_CONN=metadata_url.airflow_metadata_url(),
    )
    # Beside a `make up` on 8080/8793/8794, by the API port alone, as a user moves it
    # (AIRFLOW__API__PORT=8181 make up): the tasks' Execution API URL must follow it (issue #28),
    # and reconcile_jobs' first run below succeeds only if its task could call it.
    env.update(
        AIRFLOW__API__PORT=str(port),
        AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT=str(free_port()),
        AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT=str(free_port()),
    )
    airflow_env = {**env, "AIRFLOW_HOME": str(home / "airflow")}
    try:
        started = triage(env, "up")
        output = started.stdout + started.stderr
        assert started.returncode == 0, output[-6000:] + _tail(home / "logs" / "standalone.log")
        yield Up(env, airflow_env, f"http://127.0.0.1:{port}", output, jobs_url)
    finally:
        stopped = triage(env, "stop", timeout=120)
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        server_homes.remove(home)


def _tail(path: Path, lines: int = 80) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


def task_logs(up: Up, dag_id: str) -> str:
    logs = sorted((Path(up.env["TRIAGE_HOME"]) / "airflow" / "logs").rglob("*"))
    return "\n".join(f"==> {p} <==\n{_tail(p)}" for p in logs if p.is_file() and dag_id in str(p))


def reconcile_password(up: Up) -> str:
    return str(json.loads(reconcile_user.passwords_file(up.airflow_env).read_text())[reconcile_user.USERNAME])


def admin(up: Up) -> httpx.Client:
    from triage_tools.local import admin_login

    return api_client(up.base_url, *admin_login(up.airflow_env))


def first_reconcile_run(up: Up) -> dict[str, Any]:
    """The first run of reconcile_jobs, which the scheduler starts by itself; once it finished."""
    with admin(up) as api:
        try:
            return wait_for_first_run(api, "reconcile_jobs", timeout=240)
        except HarnessError as exc:
            pytest.fail(f"{exc}\n{_tail(Path(up.env['TRIAGE_HOME']) / 'logs' / 'standalone.log')}")


def test_make_ups_airflow_runs_a_triggerer_for_batch_mode(up: Up) -> None:
    """Batch mode's wait (``size_classify`` deferred) and resumes only through a triggerer
    (docs/model-calls.md): ``airflow standalone`` runs one, and Airflow's health says it is alive."""
    import time

    from triage_tools.local import health

    deadline, doc = time.monotonic() + 120, None
    while time.monotonic() < deadline:
        doc = health(up.base_url, timeout=10)
        if ((doc or {}).get("triggerer") or {}).get("status") == "healthy":
            break
        time.sleep(2)
    assert ((doc or {}).get("triggerer") or {}).get("status") == "healthy", doc


def test_dags_list_shows_the_backstop_unpaused_and_the_daily_classification_paused(up: Up) -> None:
    listed = subprocess.run(
        [str(ROOT / "airflow.sh"), "dags", "list", "-o", "json"],
        env=up.env,
        cwd=ROOT,
        text=True,
        capture_output=True,
        check=False,
        timeout=300,
    )
    assert listed.returncode == 0, listed.stderr[-3000:]
    from triage_tools.local import json_output

    paused = {row["dag_id"]: str(row["is_paused"]).lower() == "true" for row in json_output(listed.stdout)}
    assert paused["reconcile_jobs"] is False
    assert paused["classify_documents"] is True


def test_the_first_reconcile_run_checks_airflows_view(up: Up) -> None:
    # Its first try may fail: the scheduler can start it before the API server serves the
    # Execution API (ConnectError in the scheduler's log); the retry 30 s later runs it.
    run = first_reconcile_run(up)
    assert run["state"] == "success", f"{run}\n{task_logs(up, 'reconcile_jobs')}"
    assert run["run_type"] == "scheduled"  # nobody triggered or unpaused it
    path = f"/api/v2/dags/reconcile_jobs/dagRuns/{run['dag_run_id']}/taskInstances/reconcile/xcomEntries/return_value"
    with admin(up) as api:
        xcom = api.get(path, params={"deserialize": True})
    assert xcom.status_code == 200, xcom.text
    value = xcom.json()["value"]
    summary = json.loads(value) if isinstance(value, str) else value
    assert "airflow_view" in summary["totals"]["checked"], summary["totals"]
    assert "airflow_view" not in summary["totals"]["skipped"], summary["totals"]["skipped"]
    # The stored run and the HTML page say the same.
    with psycopg.connect(up.jobs_url.libpq()) as conn:
        row = conn.execute(
            "SELECT summary, report_path FROM triage.reconciliation_runs WHERE id = %s", (summary["run"]["id"],)
        ).fetchone()
    assert row is not None
    assert [r["skipped"] for r in row[0]["rules"] if r["rule"] == "airflow_view"] == [None]
    assert "<code>airflow_view</code>" in Path(row[1]).read_text().split('id="checked"', 1)[1].split("</p>", 1)[0]


def test_the_reconcile_user_reads_and_may_not_act(up: Up) -> None:
    with api_client(up.base_url, reconcile_user.USERNAME, reconcile_password(up)) as api:
        assert api.get("/api/v2/dags/classify_documents/dagRuns").status_code == 200
        assert api.get("/api/v2/dags/classify_documents/dagRuns/~/taskInstances").status_code == 200
        trigger = api.post("/api/v2/dags/classify_documents/dagRuns", json={"logical_date": None})
        assert trigger.status_code == 403, trigger.text
        unpause = api.patch("/api/v2/dags/classify_documents", json={"is_paused": False})
        assert unpause.status_code == 403, unpause.text
        assert api.patch("/api/v2/dags/reconcile_jobs", json={"is_paused": True}).status_code == 403
        assert api.get("/api/v2/connections").status_code == 403
        assert api.get("/api/v2/variables").status_code == 403
    wrong = httpx.post(
        f"{up.base_url}/auth/token",
        timeout=30,
        json={"username": reconcile_user.USERNAME, "password": "not-the-password"},
    )
    assert wrong.status_code == 401


def test_the_reconcile_password_is_printed_and_logged_nowhere(up: Up) -> None:
    first_reconcile_run(up)  # its task log is written
    password = reconcile_password(up)
    assert password not in up.output
    assert "triage_reconcile" in up.output  # `make up` names the user, not its password
    home = Path(up.env["TRIAGE_HOME"])
    logs = [p for folder in (home / "logs", home / "airflow" / "logs") for p in folder.rglob("*") if p.is_file()]
    assert any("reconcile_jobs" in str(p) for p in logs)
    assert [p for p in logs if password in p.read_text(errors="replace")] == []


def test_the_triage_pages_are_served_by_make_ups_api_server(up: Up) -> None:
    """Issue #14 under ``make up`` as shipped: the plugin is loaded (its two UI entries listed by
    Airflow), its pages and API answer through Airflow's auth, and the first reconcile run's
    report is the one ``/triage/reports/latest`` renders from the database."""
    run = first_reconcile_run(up)
    with psycopg.connect(up.jobs_url.libpq()) as conn:
        row = conn.execute(
            "SELECT id FROM triage.reconciliation_runs WHERE dag_run_id = %s", (run["dag_run_id"],)
        ).fetchone()
    assert row is not None, "the reconcile run stored no report under its Airflow run id"
    summary_id = row[0]
    assert httpx.get(f"{up.base_url}/triage/api/reviews", timeout=30).status_code == 401
    with admin(up) as api:
        plugins = api.get("/api/v2/plugins").json()["plugins"]
        views = {v["name"] for p in plugins if p["name"] == "triage" for v in p["external_views"]}
        assert views == {"Triage", "Triage report"}, plugins
        reviews = api.get("/triage/api/reviews")
        assert reviews.status_code == 200, reviews.text
        latest = api.get("/triage/api/reports/latest")
        assert latest.status_code == 200, latest.text
        assert latest.json()["id"] >= summary_id  # the first run's, or a later scheduled one's
        queue = api.get("/triage/review")
        assert queue.status_code == 200, queue.text[:2000]
        assert "text/html" in queue.headers["content-type"]
        tab = api.get(f"/triage/reports/airflow/reconcile_jobs/{run['dag_run_id']}")
        assert tab.status_code == 200, tab.text[:2000]
        assert "airflow_view" in tab.text
    with api_client(up.base_url, reconcile_user.USERNAME, reconcile_password(up)) as viewer:
        refused = viewer.post(f"/triage/api/reviews/{uuid.uuid4()}", json={"action": "requeue", "note": "x"})
        assert refused.status_code == 403, refused.text


# -- intake (issue #15): posted with curl, classified without anyone triggering a DAG ----------------

INTAKE_DOCS = [
    {
        "source": "helpdesk",
        "external_id": f"UP-{n}",
        "subject": subject,
        "body": body,
        "received_at": "2026-12-01T09:00:00+00:00",
    }
    for n, (subject, body) in enumerate(
        [
            ("Refund please", "I was charged twice for my order; please refund the duplicate charge."),
            ("Where is my parcel", "The shipping tracking number shows no delivery update for a week."),
        ],
        start=1,
    )
]


def curl(up: Up, document: dict[str, Any], token: str | None) -> tuple[int, dict[str, Any]]:
    """``curl -X POST …/triage/api/documents`` as docs/intake.md shows it; (HTTP status, JSON answer)."""
    argv = ["curl", "-sS", "-w", "\n%{http_code}", "-X", "POST", f"{up.base_url}/triage/api/documents"]
    argv += ["-H", "Content-Type: application/json", "--data-binary", json.dumps(document)]
    if token is not None:
        argv += ["-H", f"Authorization: Bearer {token}"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    body, _, code = done.stdout.rpartition("\n")
    return int(code), json.loads(body or "{}")


def token_of(up: Up, username: str, password: str) -> str:
    response = httpx.post(f"{up.base_url}/auth/token", json={"username": username, "password": password}, timeout=60)
    assert response.status_code == 201, response.text
    return str(response.json()["access_token"])


def wait_for_intake_dag(up: Up, timeout: float = 240) -> None:
    """Until the DAG processor has parsed classify_intake (and Airflow knows its asset)."""
    import time

    deadline = time.monotonic() + timeout
    with admin(up) as api:
        while time.monotonic() < deadline:
            dag = api.get("/api/v2/dags/classify_intake")
            assets = api.get("/api/v2/assets", params={"name_pattern": "triage_intake"})
            if dag.status_code == 200 and assets.status_code == 200 and assets.json().get("assets"):
                assert dag.json()["is_paused"] is False  # nobody unpaused it
                return
            time.sleep(2)
    pytest.fail(
        "classify_intake was not parsed in time\n" + _tail(Path(up.env["TRIAGE_HOME"]) / "logs" / "standalone.log")
    )


def test_documents_posted_with_curl_are_classified_within_two_minutes_without_a_trigger(up: Up) -> None:
    import time

    from triage_tools.local import admin_login

    wait_for_intake_dag(up)
    token = token_of(up, *admin_login(up.airflow_env))
    first, second, again = (curl(up, d, token) for d in (*INTAKE_DOCS, INTAKE_DOCS[0]))
    assert [first[0], second[0], again[0]] == [202, 202, 200], (first, second, again)
    assert again[1]["job_id"] == first[1]["job_id"] != second[1]["job_id"]
    posted = time.monotonic()

    settled: dict[str, dict[str, Any]] = {}
    with admin(up) as api:
        while len(settled) < 2 and time.monotonic() - posted < 120:
            for answer in (first[1], second[1]):
                where = api.get(f"/triage/api/documents/{answer['job_id']}").json()
                if where["status"] == "completed" or (where["status"] == "manual_review" and where["review_reason"]):
                    settled[answer["job_id"]] = where
            time.sleep(1)
        runs = api.get("/api/v2/dags/classify_intake/dagRuns").json()["dag_runs"]
    assert len(settled) == 2, f"not settled in 2 minutes: {settled}\n{task_logs(up, 'classify_intake')}"
    assert all(s["status"] != "completed" or s["label"] for s in settled.values()), settled
    assert runs
    assert {r["run_type"] for r in runs} == {"asset_triggered"}  # nobody triggered a DAG
    with psycopg.connect(up.jobs_url.libpq()) as conn:
        jobs = conn.execute("SELECT count(*) FROM triage.jobs WHERE batch_key = 'intake'").fetchone()
    assert jobs == (2,)


def test_intake_without_a_token_gets_401_and_without_the_right_403(up: Up) -> None:
    status, _ = curl(up, INTAKE_DOCS[0], None)
    assert status == 401
    status, answer = curl(up, INTAKE_DOCS[0], token_of(up, reconcile_user.USERNAME, reconcile_password(up)))
    assert status == 403, answer
    assert "classify_intake" in answer["detail"]


def _settled(api: httpx.Client, job_id: str, timeout: float) -> dict[str, Any] | None:
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        where = api.get(f"/triage/api/documents/{job_id}").json()
        if where["status"] in ("completed", "manual_review"):
            return dict(where)
        time.sleep(0.5)
    return None


def _movers(up: Up, external_id: str) -> list[str]:
    """The classify_intake runs whose tasks moved the job of ``external_id``."""
    with psycopg.connect(up.jobs_url.libpq()) as conn:
        row = conn.execute(
            "SELECT array_agg(DISTINCT split_part(e.actor, '/', 2)) FROM triage.job_events e"
            " JOIN triage.jobs j ON j.id = e.job_id WHERE j.external_id = %s AND e.actor LIKE 'classify_intake/%%'",
            (external_id,),
        ).fetchone()
    return list(row[0] or []) if row else []


def _past_its_claims(api: httpx.Client, run_id: str, timeout: float = 120) -> bool:
    """Waits until the run's classify tasks have all succeeded (no claim of it is left) while the
    run is still running; False if it ended first."""
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if api.get(f"/api/v2/dags/classify_intake/dagRuns/{run_id}").json()["state"] != "running":
            return False
        tis = api.get(f"/api/v2/dags/classify_intake/dagRuns/{run_id}/taskInstances").json()["task_instances"]
        classify = [t["state"] for t in tis if t["task_id"] == "classify"]
        if classify and all(state == "success" for state in classify):
            return True
        time.sleep(0.2)
    return False


def test_a_document_posted_while_a_run_is_past_its_claims_is_classified_by_the_next_run(up: Up) -> None:
    """Runs never pile up (max_active_runs=1), and none strands a document: A is classified by a
    run; B is posted once that run's classify tasks have succeeded while the run is still active
    (publish_events to go: no claim of it will take B). B's asset event waits for the
    run to end, and the next run classifies B."""
    from triage_tools.local import admin_login

    wait_for_intake_dag(up)
    token = token_of(up, *admin_login(up.airflow_env))
    for attempt in range(3):  # until B is posted while A's run is still active
        a, b = ({**INTAKE_DOCS[0], "external_id": f"UP-RUN-{attempt}-{n}"} for n in ("A", "B"))
        status, posted_a = curl(up, a, token)
        assert status == 202, posted_a
        with admin(up) as api:
            assert _settled(api, posted_a["job_id"], 180) is not None, task_logs(up, "classify_intake")
            [run_of_a] = _movers(up, a["external_id"])
            if not _past_its_claims(api, run_of_a):
                continue  # A's run ended before we could post: try again
            status, posted_b = curl(up, b, token)
            assert status == 202, posted_b
            after = api.get(f"/api/v2/dags/classify_intake/dagRuns/{run_of_a}").json()["state"]
            if after != "running":
                continue  # it ended while B was being posted: not the case under test
            assert _settled(api, posted_b["job_id"], 240) is not None, task_logs(up, "classify_intake")
            runs = api.get("/api/v2/dags/classify_intake/dagRuns").json()["dag_runs"]
        [run_of_b] = _movers(up, b["external_id"])
        assert run_of_b != run_of_a  # the next run, started once A's had ended, took B
        assert sum(r["state"] in ("running", "queued") for r in runs) <= 1
        return
    pytest.fail("no try posted B while A's run was still active")
