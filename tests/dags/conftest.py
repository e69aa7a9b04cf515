"""Airflow in this test process gets a home of its own, never the user's ~/airflow; tests that
run Airflow processes get a fresh metadata database and a fresh job database."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
import sqlalchemy as sa

if TYPE_CHECKING:
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
    jobs_url: object  # triage.database.DatabaseUrl
    home: Path

    def engine(self) -> sa.Engine:
        from triage.database import create_engine

        return create_engine(self.jobs_url, poolclass=sa.NullPool)  # type: ignore[arg-type]

    def scalar(self, sql: str, **params: object) -> object:
        engine = self.engine()
        try:
            with engine.connect() as conn:
                return conn.execute(sa.text(sql), params).scalar()
        finally:
            engine.dispose()


def dags_connection(pg_server, jobs_url):  # type: ignore[no-untyped-def]
    """What ``triage_db`` names for the DAGs: the least-privilege ``triage_worker``, as on the
    embedded deployment, when the test server trusts local sockets (the embedded one does);
    the given user on a server of ``TRIAGE_TEST_DATABASE_URL``, which may require passwords."""
    from triage.roles import ensure_worker_role, worker_url

    if not pg_server.is_socket:
        return jobs_url
    ensure_worker_role(pg_server)
    return worker_url(jobs_url)


@contextlib.contextmanager
def fresh_databases(pg_server, template_db: str, name: str) -> Iterator[tuple[DatabaseUrl, DatabaseUrl]]:  # type: ignore[no-untyped-def]
    """An empty Airflow metadata database and a job database cloned from the migrated template,
    on the test server, as ``(metadata, jobs)``; both dropped afterwards."""
    suffix = uuid.uuid4().hex[:10]
    metadata_db, jobs_db = f"airflow_{name}_{suffix}", f"triage_{name}_{suffix}"
    with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{metadata_db}"')
        conn.execute(f'CREATE DATABASE "{jobs_db}" TEMPLATE "{template_db}" STRATEGY FILE_COPY')
        # A clone gets the default ACL, not its template's: the DAGs run without TEMP, as deployed.
        conn.execute(f'REVOKE TEMPORARY ON DATABASE "{jobs_db}" FROM PUBLIC')
    try:
        yield pg_server.with_database(metadata_db), pg_server.with_database(jobs_db)
    finally:
        with psycopg.connect(pg_server.libpq(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{metadata_db}" WITH (FORCE)')
            conn.execute(f'DROP DATABASE IF EXISTS "{jobs_db}" WITH (FORCE)')


def triage_airflow_env(pg_server, metadata_url: DatabaseUrl, jobs_url: DatabaseUrl, home: Path,  # type: ignore[no-untyped-def]
                       extra: dict[str, str] | None = None) -> dict[str, str]:  # fmt: skip
    """Airflow's environment of a test deployment (:func:`tests.dags.airflow_harness.airflow_test_env`)
    with Triage's: ``triage_db`` as the DAGs log in, the job database, ``TRIAGE_HOME``; ``extra`` last."""
    from tests.dags.airflow_harness import airflow_test_env

    triage = {
        "AIRFLOW_CONN_TRIAGE_DB": dags_connection(pg_server, jobs_url).airflow_connection_json(),
        "TRIAGE_DATABASE_URL": jobs_url.libpq(),
        "TRIAGE_HOME": str(home),
    }
    return airflow_test_env(home / "airflow", metadata_url=metadata_url.airflow_metadata_url(),
                            dags_folder=ROOT / "dags", extra={**triage, **(extra or {})})  # fmt: skip


@pytest.fixture(scope="module")
def deployment(pg_server, template_db, server_homes) -> Iterator[Deployment]:  # type: ignore[no-untyped-def]
    """A migrated Airflow metadata database and a job database (cloned from the migrated
    template) on the test server, with TRIAGE_HOME (payloads, event log, Airflow home) in a
    folder of ``server_homes`` (not pytest's tmp root: see tests/conftest.py)."""
    from tests.dags.airflow_harness import airflow_cli, migrate_metadata

    with fresh_databases(pg_server, template_db, "test") as (metadata_url, jobs_url):
        home = server_homes.make("deployment")
        env = triage_airflow_env(pg_server, metadata_url, jobs_url, home)
        migrate_metadata(env)
        # classify takes slots of the llm_api pool (airflow_settings.yaml): a scheduler never queues
        # a task whose pool does not exist.
        airflow_cli(env, "pools", "set", "llm_api", "32", "model calls in flight")
        yield Deployment(env=env, jobs_url=jobs_url, home=home)
    server_homes.remove(home)
