"""The Airflow fixtures of the airflow, e2e and drills tiers (a pytest plugin: tests/conftest.py
registers it). Airflow in this test process gets a home of its own, never the user's ~/airflow;
tests that run Airflow processes get a fresh metadata database and a fresh job database, the job
database (and, for a deployment, the metadata database) cloned from a migrated template
(``CREATE DATABASE … TEMPLATE``)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
import sqlalchemy as sa

from triage_tools.warm import WarmAirflow

if TYPE_CHECKING:
    from collections.abc import Callable

    from tests.conftest import ServerHomes, SharedServer
    from triage.database import DatabaseUrl

ROOT = Path(__file__).resolve().parents[2]

os.environ.setdefault("AIRFLOW_HOME", tempfile.mkdtemp(prefix="triage-airflow-home-"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(ROOT / "dags"))
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "True")


@dataclass
class Deployment:
    """Airflow's environment for one test module, and the job database it writes to."""

    env: dict[str, str]
    jobs_url: DatabaseUrl
    home: Path
    _warm: WarmAirflow | None = field(default=None, repr=False)

    def dags_test(
        self, *args: str, timeout: float = 600, env: Mapping[str, str] | None = None, **more_env: str
    ) -> subprocess.CompletedProcess[str]:
        """``airflow dags test ARGS`` with this deployment's environment, ``env`` and ``more_env``,
        its output captured; forked from one warm process for the module (triage_tools/warm.py)."""
        if self._warm is None:
            self._warm = WarmAirflow(self.env, self.home / "warm-dags-test.log")
        return self._warm.run(["dags", "test", *args], {**self.env, **(env or {}), **more_env}, timeout)

    def close(self) -> None:
        if self._warm is not None:
            self._warm.close()

    def engine(self) -> sa.Engine:
        from triage.database import create_engine

        return create_engine(self.jobs_url, poolclass=sa.NullPool)

    def scalar(self, sql: str, **params: object) -> Any:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text(sql), params).scalar()
        finally:
            engine.dispose()


def dags_connection(
    pg_server: DatabaseUrl, jobs_url: DatabaseUrl, login: Callable[[DatabaseUrl], DatabaseUrl] | None = None
) -> DatabaseUrl:
    """What ``triage_db`` names for the DAGs: the least-privilege ``triage_worker`` (or ``login``:
    ``triage.roles.reviewer_url``, ``maintainer_url``), as on the embedded deployment, when the
    test server trusts local sockets (the embedded one does); the given user on a server of
    ``TRIAGE_TEST_DATABASE_URL``, which may require passwords."""
    from triage.roles import ensure_worker_role, worker_url

    if not pg_server.is_socket:
        return jobs_url
    ensure_worker_role(pg_server)
    return (login or worker_url)(jobs_url)


@contextlib.contextmanager
def fresh_databases(
    pg_server: DatabaseUrl, template_db: str, name: str, metadata_template: str | None = None
) -> Iterator[tuple[DatabaseUrl, DatabaseUrl]]:
    """An Airflow metadata database, empty or cloned from ``metadata_template``
    (:func:`airflow_metadata_template`), and a job database cloned from the migrated template, on
    the test server, as ``(metadata, jobs)``; both dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    metadata_db, jobs_db = f"airflow_{name}_{suffix}", f"triage_{name}_{suffix}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        if metadata_template is None:
            conn.execute(f'CREATE DATABASE "{metadata_db}"')
        else:
            conn.execute(f'CREATE DATABASE "{metadata_db}" TEMPLATE "{metadata_template}" STRATEGY FILE_COPY')
        conn.execute(f'CREATE DATABASE "{jobs_db}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
        # A clone gets the default ACL, not its template's: the DAGs run without TEMP, as deployed.
        conn.execute(f'REVOKE TEMPORARY ON DATABASE "{jobs_db}" FROM PUBLIC')
    try:
        yield pg_server.with_database(metadata_db), pg_server.with_database(jobs_db)
    finally:
        with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{metadata_db}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "{jobs_db}" WITH (FORCE)')


def triage_airflow_env(
    pg_server: DatabaseUrl,
    metadata_url: DatabaseUrl,
    jobs_url: DatabaseUrl,
    home: Path,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """Airflow's environment of a test deployment (:func:`tests.harness.airflow.airflow_test_env`)
    with Triage's: ``triage_db`` as the DAGs log in, the job database, ``TRIAGE_HOME``; ``extra`` last."""
    from tests.harness.airflow import airflow_test_env
    from triage.roles import maintainer_url, reviewer_url

    triage = {
        "AIRFLOW_CONN_TRIAGE_DB": dags_connection(pg_server, jobs_url).airflow_connection_json(),
        "AIRFLOW_CONN_TRIAGE_DB_REVIEW": dags_connection(pg_server, jobs_url, reviewer_url).airflow_connection_json(),
        "AIRFLOW_CONN_TRIAGE_DB_MAINTENANCE": dags_connection(
            pg_server, jobs_url, maintainer_url
        ).airflow_connection_json(),
        "TRIAGE_DATABASE_URL": jobs_url.libpq(),
        "TRIAGE_HOME": str(home),
    }
    return airflow_test_env(
        home / "airflow",
        metadata_url=metadata_url.airflow_metadata_url(),
        dags_folder=ROOT / "dags",
        extra={**triage, **(extra or {})},
    )


# What every deployment's metadata database holds besides Airflow's tables: the pool that classify
# takes slots of (airflow_settings.yaml's llm_api), since a scheduler never queues a task whose
# pool does not exist. Airflow CLI arguments, run once on the template.
METADATA_SETUP = (("pools", "set", "llm_api", "32", "model calls in flight"),)
METADATA_TEMPLATE_PREFIX = "airflow_template_"


@pytest.fixture(scope="session")
def airflow_metadata_template(pg_server: DatabaseUrl, shared_server: SharedServer, server_homes: ServerHomes) -> str:
    """The name of a migrated Airflow metadata database that deployments clone.

    ``airflow db migrate`` and ``pools set`` cost some 9 s of CPU (two Airflow CLI processes),
    and every module of Airflow tests ran them for a metadata database of its own. Now the first
    process to ask (an xdist worker, or another run on the same server) makes the template under
    a lock of the server's, and every other finds it: once per start of the test server. Its name
    holds a digest of the Airflow version and :data:`METADATA_SETUP` and the server's start time:
    a restarted server or another Airflow gets a new template, and older ones are dropped then.
    The template refuses connections, so that nothing changes it after it is made."""
    with shared_server.locked("airflow-template.lock"):
        return _metadata_template(pg_server, server_homes)


def _metadata_template(pg_server: DatabaseUrl, server_homes: ServerHomes) -> str:
    from importlib import metadata

    from tests.harness.airflow import airflow_cli, airflow_test_env, migrate_metadata

    setup = json.dumps([metadata.version("apache-airflow"), METADATA_SETUP])
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        row = conn.execute("SELECT extract(epoch FROM pg_postmaster_start_time())::bigint").fetchone()
        assert row is not None
        name = f"{METADATA_TEMPLATE_PREFIX}{hashlib.sha256(setup.encode()).hexdigest()[:10]}_{row[0]}"
        if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            return name
        # Templates of an earlier start of the server, or one whose making was interrupted.
        stale = conn.execute(
            "SELECT datname FROM pg_database WHERE starts_with(datname, %s)", (METADATA_TEMPLATE_PREFIX,)
        ).fetchall()
        for (old,) in stale:
            conn.execute(f'ALTER DATABASE "{old}" WITH IS_TEMPLATE false')
            conn.execute(f'DROP DATABASE "{old}" WITH (FORCE)')
        making = f"{name}_partial"
        conn.execute(f'CREATE DATABASE "{making}"')
    home = server_homes.make("airflow-template")
    try:
        metadata_url = pg_server.with_database(making).airflow_metadata_url()
        env = airflow_test_env(home, metadata_url=metadata_url, dags_folder=ROOT / "dags")
        migrate_metadata(env)
        for args in METADATA_SETUP:
            airflow_cli(env, *args)
    finally:
        server_homes.remove(home)
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{making}" RENAME TO "{name}"')
        conn.execute(f'ALTER DATABASE "{name}" WITH IS_TEMPLATE true ALLOW_CONNECTIONS false')
    return name


@pytest.fixture(scope="module")
def deployment(
    pg_server: DatabaseUrl, template_db: str, airflow_metadata_template: str, server_homes: ServerHomes
) -> Iterator[Deployment]:
    """An Airflow metadata database (cloned from :func:`airflow_metadata_template`) and a job
    database (cloned from the migrated ``template_db``) on the test server, with TRIAGE_HOME
    (payloads, event log, Airflow home) in a folder of ``server_homes`` (not pytest's tmp root:
    see tests/conftest.py)."""
    databases = fresh_databases(pg_server, template_db, "test", metadata_template=airflow_metadata_template)
    with databases as (metadata_url, jobs_url):
        home = server_homes.make("deployment")
        env = triage_airflow_env(pg_server, metadata_url, jobs_url, home)
        deployment = Deployment(env=env, jobs_url=jobs_url, home=home)
        try:
            yield deployment
        finally:
            deployment.close()
    server_homes.remove(home)
