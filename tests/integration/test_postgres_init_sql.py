"""docker/postgres-init/01-triage.sql on a real PostgreSQL, run the way the postgres image runs it.

The script creates cluster-wide roles, so it gets a private throwaway server (``pgserver``), not
the shared test server. Authentication is ``trust`` there: these tests check privileges, not
passwords (test_compose.py checks that the passwords match the compose file).
"""

from __future__ import annotations

import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo

from tests.conftest import ServerHomes

INIT_SQL = Path(__file__).resolve().parents[2] / "docker" / "postgres-init" / "01-triage.sql"


@pytest.fixture(scope="module")
def server(server_homes: ServerHomes) -> Iterator[str]:
    """A fresh cluster with the compose file's superuser database, after the init script ran."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver.postgres_server import POSTGRES_BIN_PATH

    home = server_homes.make("compose-postgres")
    pg = pgserver.get_server(home / "pgdata", cleanup_mode="delete")
    try:
        info = pg.get_postmaster_info()
        params = {"host": str(info.socket_dir), "port": str(info.port)}
        base = make_conninfo(**params)
        with connect(base, "postgres", "postgres") as conn:
            conn.execute("CREATE DATABASE airflow")  # POSTGRES_DB of docker-compose.yaml
        # The postgres image's docker_process_sql: psql, stop at the first error, no psqlrc.
        subprocess.run(
            [
                str(POSTGRES_BIN_PATH / "psql"),
                "-v",
                "ON_ERROR_STOP=1",
                "--no-psqlrc",
                "--host",
                params["host"],
                "--port",
                params["port"],
                "--username",
                "postgres",
                "--dbname",
                "airflow",
                "-f",
                str(INIT_SQL),
            ],
            check=True,
            capture_output=True,
        )
        # Stand in for the first migration: the owner creates a table with a sequence.
        with connect(base, "triage") as conn:
            conn.execute("CREATE TABLE triage.jobs (id bigserial PRIMARY KEY, status text NOT NULL)")
        yield base
    finally:
        pg.cleanup()
        server_homes.remove(home)


def connect(server: str, user: str, dbname: str = "triage") -> psycopg.Connection:
    return psycopg.connect(make_conninfo(server, user=user, dbname=dbname), autocommit=True)


def test_triage_database_is_owned_by_the_migration_role(server: str) -> None:
    with connect(server, "triage") as conn:
        owner = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = 'triage'").fetchone()
        schema_owner = conn.execute(
            "SELECT pg_get_userbyid(nspowner) FROM pg_namespace WHERE nspname = 'triage'"
        ).fetchone()
    assert owner == ("triage",)
    assert schema_owner == ("triage",)


def test_app_role_reads_and_writes_rows_of_migrated_tables(server: str) -> None:
    with connect(server, "triage_app") as conn:
        row = conn.execute("INSERT INTO triage.jobs (status) VALUES ('received') RETURNING id").fetchone()
        assert row is not None
        (job_id,) = row
        conn.execute("UPDATE triage.jobs SET status = 'queued' WHERE id = %s", (job_id,))
        assert conn.execute("SELECT status FROM triage.jobs WHERE id = %s", (job_id,)).fetchone() == ("queued",)
        conn.execute("DELETE FROM triage.jobs WHERE id = %s", (job_id,))


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("CREATE TABLE triage.extra (id int)", id="create-in-triage"),
        pytest.param("CREATE TABLE public.extra (id int)", id="create-in-public"),
        pytest.param("ALTER TABLE triage.jobs ADD COLUMN x int", id="alter"),
        pytest.param("DROP TABLE triage.jobs", id="drop"),
        pytest.param("TRUNCATE triage.jobs", id="truncate"),
    ],
)
def test_app_role_cannot_change_the_schema(server: str, statement: str) -> None:
    with connect(server, "triage_app") as conn, pytest.raises(errors.InsufficientPrivilege):
        conn.execute(statement)


@pytest.mark.parametrize(
    ("user", "dbname"),
    [
        pytest.param("triage_app", "airflow", id="app-to-airflow-metadata"),
        pytest.param("triage", "airflow", id="owner-to-airflow-metadata"),
        pytest.param("outsider", "triage", id="other-role-to-triage"),
    ],
)
def test_databases_are_closed_to_other_roles(server: str, user: str, dbname: str) -> None:
    with connect(server, "postgres", "postgres") as admin:
        admin.execute("DO $$ BEGIN CREATE ROLE outsider LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$")
    with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
        connect(server, user, dbname).close()


def test_the_migrations_run_as_the_owner_and_narrow_the_app_role(server: str) -> None:
    """What triage-migrate does: every migration as `triage` (no superuser, no CREATEROLE).
    0003 finds the init script's triage_app and narrows its default privileges per table."""
    from triage import migrations
    from triage.database import DatabaseUrl

    with connect(server, "postgres", "postgres") as admin:  # a second job database, laid out like `triage`
        admin.execute("CREATE DATABASE triage_migrated OWNER triage")
    with connect(server, "triage", "triage_migrated") as conn:
        conn.execute("CREATE SCHEMA triage AUTHORIZATION triage")
        conn.execute("GRANT USAGE ON SCHEMA triage TO triage_app")
    migrations.upgrade(DatabaseUrl.parse(make_conninfo(server, user="triage", dbname="triage_migrated")))
    with connect(server, "triage_app", "triage_migrated") as conn:
        assert conn.execute("SELECT count(*) FROM triage.job_events").fetchone() == (0,)
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DELETE FROM triage.job_events")
        with pytest.raises(errors.InsufficientPrivilege):  # only the triggers write the log (0004)
            conn.execute(
                "INSERT INTO triage.job_events (job_id, to_status, step, attempt, actor)"
                " VALUES (gen_random_uuid(), 'queued', 'classify', 0, 'forged')"
            )
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute("DROP TABLE triage.jobs")
