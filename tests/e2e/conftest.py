"""The e2e tier's one running Airflow: API server, scheduler, DAG processor and triggerer, started
once per pytest process and shared by every module of the tier (``make test`` runs the tier in a
process of its own, on no xdist worker: one deployment, not one per worker).

Its DAG folder holds the project's DAGs and the probes of ``tests/e2e/dags`` (symbolic links: a
DAG file never reads its own path). Its model connection (``triage_llm``) points at one fake
OpenAI-compatible server and its alert connection (``triage_alerts``) at one fake provider;
a test sets what the model answers (``e2e.model.responder``), and :func:`e2e` puts the defaults
back after it. Scheduling is off (``use_job_schedule``): no scheduled ``classify_documents`` or
quarter-hour ``reconcile_jobs`` run may act on another test's work; tests trigger the runs they
need. Its auth manager has users (the browser test logs in as ``reviewer``); the harness calls
the API as ``admin`` (``running_airflow(login=...)``), and ``reconcile_jobs`` reads Airflow's view
as its own ``triage_reconcile`` user, as under ``make up``.

Tests keep apart by what they own, not by cleaning up: each uses logical dates, run ids and batch
keys of its own (a module's docstring names them) and reads the ledger and the fakes only for
those, never as totals.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.fakes.openai_server import FakeOpenAIServer, fixed_label
from tests.fakes.provider import FakeProvider
from tests.harness.airflow import AirflowCli, HarnessError, RunningAirflow, free_port, running_airflow
from tests.harness.deployment import ROOT, Deployment, fresh_databases, triage_airflow_env

if TYPE_CHECKING:
    from tests.conftest import ServerHomes
    from triage.database import DatabaseUrl

PROBES = Path(__file__).resolve().parent / "dags"
USERS = {"admin": "admin", "reviewer": "user", "watcher": "viewer"}  # name -> SimpleAuthManager role
BATCH_POLL_SECONDS = 1  # batch mode: the triggerer looks at the provider's batch every second


def default_model() -> FakeOpenAIServer:
    return FakeOpenAIServer(responder=fixed_label("billing"))


@dataclass
class E2E:
    """The running deployment and its fakes."""

    deployment: Deployment  # the job database (``engine``, ``scalar``), TRIAGE_HOME
    airflow: RunningAirflow  # ``get``/``post``/``patch`` as admin, ``logs``
    cli: AirflowCli  # ``airflow ARGS`` against it, forked from one warm process
    model: FakeOpenAIServer
    provider: FakeProvider
    passwords: dict[str, str]  # SimpleAuthManager's users and their passwords

    @property
    def env(self) -> dict[str, str]:
        """Airflow's environment of the running deployment (its ports included)."""
        return self.airflow.env

    def backfill(self, dag_id: str, from_date: str, to_date: str, *args: str, timeout: float = 180) -> None:
        """``airflow backfill create`` (what ``./airflow.sh backfill create`` does), once the DAG's
        previous backfill is done: Airflow runs one backfill per DAG at a time, and marks one
        complete a scheduler loop after its last run ended (another test's, here)."""
        command = ["backfill", "create", "--dag-id", dag_id, "--from-date", from_date, "--to-date", to_date, *args]
        deadline = time.monotonic() + timeout
        while True:
            done = self.cli(*command, check=False)
            if done.returncode == 0:
                return
            if "AlreadyRunningBackfill" not in done.stdout + done.stderr or time.monotonic() > deadline:
                raise HarnessError(f"airflow {' '.join(command)} exited {done.returncode}:\n{done.stderr[-3000:]}")
            time.sleep(2)


def _dags_folder(home: Path) -> Path:
    folder = home / "dags"
    folder.mkdir()
    for dag in [*sorted((ROOT / "dags").glob("*.py")), *sorted(PROBES.glob("*.py"))]:
        (folder / dag.name).symlink_to(dag)
    return folder


@pytest.fixture(scope="session")
def e2e_deployment(
    pg_server: DatabaseUrl, template_db: str, airflow_metadata_template: str, server_homes: ServerHomes
) -> Iterator[E2E]:
    """The tier's deployment (see the module doc), for the whole session."""
    from triage_tools.deploy import reconcile_user
    from triage_tools.processes import side_by_side_env

    databases = fresh_databases(pg_server, template_db, "e2e", metadata_template=airflow_metadata_template)
    home = server_homes.make("e2e")
    try:
        with databases as (metadata_url, jobs_url), default_model() as model, FakeProvider() as provider:
            passwords = {user: secrets.token_urlsafe(12) for user in USERS}
            passwords_file = home / "simple-auth-passwords.json"
            passwords_file.write_text(json.dumps(passwords))
            llm = {"conn_type": "http", "host": model.base_url, "extra": {"batch_poll_seconds": BATCH_POLL_SECONDS}}
            env = triage_airflow_env(
                pg_server,
                metadata_url,
                jobs_url,
                home,
                extra={
                    "AIRFLOW_CONN_TRIAGE_LLM": json.dumps(llm),
                    "AIRFLOW_CONN_TRIAGE_ALERTS": json.dumps({"conn_type": "http", "host": provider.url}),
                    "TRIAGE_INTAKE_CLASSIFIER": "llm",
                    "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": ",".join(f"{u}:{r}" for u, r in USERS.items()),
                    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords_file),
                },
            )
            port = free_port()
            env.update(side_by_side_env(port))
            env.update(reconcile_user.local_settings(env))  # triage_reconcile and its airflow_api connection
            deployment = Deployment(env=env, jobs_url=jobs_url, home=home)
            with (
                running_airflow(
                    env,
                    _dags_folder(home),
                    timeout=240,
                    api_port=port,
                    triggerer=True,
                    login=("admin", passwords["admin"]),
                ) as airflow,
                AirflowCli(airflow.env, home / "airflow-cli.log") as cli,
            ):
                yield E2E(deployment, airflow, cli, model, provider, passwords)
    finally:
        server_homes.remove(home)


@pytest.fixture
def e2e(e2e_deployment: E2E) -> Iterator[E2E]:
    """The shared deployment; its model answers ``billing`` again after the test."""
    yield e2e_deployment
    model = e2e_deployment.model
    model.responder = fixed_label("billing")
    model.batches.polls_until_done = 1
