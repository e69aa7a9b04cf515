"""docker/postgres-init/01-triage.sql on a real PostgreSQL, run the way the postgres image runs it.

The script creates cluster-wide roles, so it gets a private throwaway server (the embedded
PostgreSQL under a temporary home), not the shared test server. Authentication is ``trust`` there: these tests check privileges, not
passwords (test_compose.py checks that the passwords match the compose file).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import errors
from psycopg.conninfo import make_conninfo

from tests.conftest import ServerHomes
from triage_tools import embedded

INIT_SQL = Path(__file__).resolve().parents[2] / "docker" / "postgres-init" / "01-triage.sql"


@pytest.fixture(scope="module")
def server(server_homes: ServerHomes) -> Iterator[str]:
    """A fresh cluster with the compose file's superuser database, after the init script ran."""
    home = server_homes.make("compose-postgres")
    url = embedded.start(home, databases=())
    try:
        assert url.host is not None
        params = {"host": url.host, "port": str(url.port)}
        base = make_conninfo(**params)
        with connect(base, "postgres", "postgres") as conn:
            conn.execute("CREATE DATABASE airflow")  # POSTGRES_DB of docker-compose.yaml
        # The postgres image's docker_process_sql: psql, stop at the first error, no psqlrc.
        subprocess.run(
            [
                str(embedded.bin_dir() / "psql"),
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
        embedded.stop(home)
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


@pytest.fixture(scope="module")
def migrated(server: str) -> str:
    """What triage-migrate does: every migration as `triage` (no superuser, no CREATEROLE), on a
    second job database laid out like `triage`. Returns its name."""
    from triage import migrations
    from triage.database import DatabaseUrl

    with connect(server, "postgres", "postgres") as admin:
        admin.execute("CREATE DATABASE triage_migrated OWNER triage")
    with connect(server, "triage", "triage_migrated") as conn:
        conn.execute("CREATE SCHEMA triage AUTHORIZATION triage")
        conn.execute("GRANT USAGE ON SCHEMA triage TO triage_app")
    migrations.upgrade(DatabaseUrl.parse(make_conninfo(server, user="triage", dbname="triage_migrated")))
    return "triage_migrated"


def test_the_migrations_run_as_the_owner_and_narrow_the_app_role(server: str, migrated: str) -> None:
    """0003 finds the init script's triage_app and narrows its default privileges per table."""
    with connect(server, "triage_app", migrated) as conn:
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


def test_the_init_script_grants_no_temp_and_prepares_the_ledger_owner(server: str) -> None:
    with connect(server, "postgres", "postgres") as admin:
        row = admin.execute(
            "SELECT has_database_privilege('triage_app', 'triage', 'TEMPORARY'),"
            " has_database_privilege('public', 'triage', 'TEMPORARY'),"
            " (SELECT rolcanlogin FROM pg_roles WHERE rolname = 'triage_ledger_owner'),"
            " pg_has_role('triage', 'triage_ledger_owner', 'MEMBER'),"
            " pg_has_role('triage_app', 'triage_ledger_owner', 'MEMBER')"
        ).fetchone()
    assert row == (False, False, False, True, False)


def test_on_compose_the_triggers_belong_to_the_ledger_owner_and_still_log(server: str, migrated: str) -> None:
    """0005 as `triage`, not a superuser: it hands the triggers over through its membership and
    revokes TEMP as the database's owner; the app role's moves are logged under its login."""
    with connect(server, "triage_app", migrated) as conn:
        with pytest.raises(errors.InsufficientPrivilege, match="temporary"):
            conn.execute("CREATE TEMP TABLE fake_jobs (id uuid)")
        conn.execute(
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
            " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'queued', 3)"
        )
        assert conn.execute("SELECT to_status::text, actor FROM triage.job_events").fetchall() == [
            ("queued", "triage_app")
        ]
        owners = conn.execute(
            "SELECT DISTINCT pg_get_userbyid(proowner), has_function_privilege(oid, 'EXECUTE') FROM pg_proc"
            " WHERE oid IN ('triage.jobs_check_insert'::regproc, 'triage.jobs_check_update'::regproc)"
        ).fetchall()
    assert owners == [("triage_ledger_owner", False)]


def test_on_compose_a_borrowed_trigger_runs_no_smuggled_cast(server: str, migrated: str) -> None:
    """Even with TEMP and EXECUTE granted back, the body refuses the temp table first (on
    compose the attack once emptied the log and moved a job queued -> completed)."""
    from tests.ledger.test_definer_triggers import ON_INSERT, SMUGGLED_CAST

    with connect(server, "triage", migrated) as owner:
        owner.execute(f"GRANT TEMPORARY ON DATABASE {migrated} TO triage_app")
        owner.execute("GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA triage TO triage_app")
    try:
        with connect(server, "triage_app", migrated) as conn:
            for statement in SMUGGLED_CAST:
                conn.execute(statement)
            conn.execute(
                "CREATE TEMP TABLE fake_jobs (id pg_temp.smuggled, status triage.job_status, step text,"
                " attempt int, status_reason text, lease_owner text)"
            )
            conn.execute(ON_INSERT)
            with pytest.raises(errors.InsufficientPrivilege, match=r"of triage\.jobs only"):
                conn.execute("INSERT INTO fake_jobs VALUES ('x', 'queued', 'classify', 0, NULL, NULL)")
    finally:
        with connect(server, "triage", migrated) as owner:
            owner.execute(f"REVOKE TEMPORARY ON DATABASE {migrated} FROM triage_app")
            owner.execute(
                "REVOKE EXECUTE ON FUNCTION triage.jobs_check_insert(), triage.jobs_check_update() FROM triage_app"
            )
            owner.execute(  # and the retention functions (the maintenance role's alone)
                "REVOKE EXECUTE ON FUNCTION triage.ensure_day_partitions(integer),"
                " triage.drop_expired_partitions(text, timestamptz),"
                " triage.purge_classifications(timestamptz, bigint, integer),"
                " triage.purge_reconciliation_runs(timestamptz) FROM triage_app"
            )


def test_0005_applied_again_over_itself_changes_nothing(server: str, migrated: str) -> None:
    """Idempotent as the non-superuser owner: the owner takes the functions back from the ledger
    role (as its member), replaces them and hands them over again; the privileges stay as they are."""
    from alembic import command

    from triage import migrations
    from triage.database import DatabaseUrl

    def privileges() -> list[tuple[object, ...]]:
        with connect(server, "postgres", migrated) as conn:
            return conn.execute(
                "SELECT p.proname, pg_get_userbyid(p.proowner), p.proacl::text, p.proconfig::text FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = 'triage'"
                " UNION ALL SELECT datname, '', datacl::text, '' FROM pg_database WHERE datname = %s"
                " UNION ALL SELECT relname, '', relacl::text, '' FROM pg_class WHERE relnamespace = 'triage'::regnamespace"
                " ORDER BY 1",
                (migrated,),
            ).fetchall()

    before = privileges()
    url = DatabaseUrl.parse(make_conninfo(server, user="triage", dbname=migrated))
    command.stamp(migrations.alembic_config(url), "0004")
    migrations.upgrade(url, "0005")
    command.stamp(migrations.alembic_config(url), "head")
    # 0005's bodies are back now; 0021's replace them again the way 0021 does, as the same owner.
    v0021 = _revision("0021_roles_by_job.py")
    with connect(server, "triage", migrated) as conn:
        for function in v0021.FUNCTIONS:
            conn.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
        conn.execute(v0021.CHECK_INSERT)
        conn.execute(v0021.CHECK_UPDATE)
        conn.execute(v0021._revision("0005_ledger_owner.py").HAND_OVER)
    assert privileges() == before


def _revision(name: str) -> Any:
    """A migration revision's module, by its path."""
    import importlib.util

    from triage import migrations

    path = Path(migrations.__file__).parent / "versions" / name
    spec = importlib.util.spec_from_file_location(f"revision_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_migrating_user_outside_the_ledger_role_is_told_what_to_run(server: str) -> None:
    """An owner that is neither a superuser nor a member of triage_ledger_owner (a volume made by
    an older init script) stops at 0005 with the one GRANT to run, and nothing of 0005 stays."""
    import sqlalchemy as sa

    from triage import migrations
    from triage.database import DatabaseUrl

    with connect(server, "postgres", "postgres") as admin:
        admin.execute("CREATE ROLE triage_old_volume LOGIN")
        admin.execute("CREATE DATABASE triage_old_volume OWNER triage_old_volume")
    url = DatabaseUrl.parse(make_conninfo(server, user="triage_old_volume", dbname="triage_old_volume"))
    with pytest.raises(sa.exc.ProgrammingError) as raised:
        migrations.upgrade(url)
    error = raised.value.orig
    assert isinstance(error, errors.InsufficientPrivilege)
    assert error.diag.message_hint == (
        "run once as a superuser: GRANT triage_ledger_owner TO triage_old_volume; then run the migration again"
    )
    assert migrations.current_revision(url) == "0004"


def test_an_owner_with_createrole_creates_the_ledger_role_and_joins_it(server_home: Path) -> None:
    """A cluster without the init script, migrated by a CREATEROLE owner: 0005 creates the role,
    grants itself the membership it needs (a creator holds only ADMIN), and still goes down to
    base and up again."""
    from triage import migrations
    from triage.database import DatabaseUrl
    from triage_tools import embedded

    server = embedded.start(server_home, databases=())
    try:
        base = make_conninfo(host=server.host, port=str(server.port))
        with connect(base, "postgres", "postgres") as admin:
            admin.execute("CREATE ROLE creator LOGIN CREATEROLE")
            admin.execute("CREATE DATABASE jobs OWNER creator")
        url = DatabaseUrl.parse(make_conninfo(base, user="creator", dbname="jobs"))
        migrations.upgrade(url)
        with connect(base, "postgres", "jobs") as admin:
            owners = admin.execute(
                "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc WHERE proname LIKE 'jobs_check_%'"
            ).fetchall()
            temp = admin.execute("SELECT has_database_privilege('public', 'jobs', 'TEMPORARY')").fetchone()
        assert owners == [("triage_ledger_owner",)]
        assert temp == (False,)
        migrations.downgrade(url, "base")
        migrations.upgrade(url)
    finally:
        embedded.stop(server_home)


def test_on_compose_each_login_does_its_own_job(server: str, migrated: str) -> None:
    """The init script's triage_review and triage_maintenance log in as themselves (no member
    logins, as on the embedded server): the review role decides, the app role may not, only the
    maintenance role runs retention."""
    with connect(server, "triage_app", migrated) as conn:
        (job_id,) = conn.execute(
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, status_reason, max_attempts)"
            " VALUES ('review-me', 's', 'r', 'h', 'ref', 'v', 'c', 'b', 'classify', 'manual_review', 'x', 3)"
            " RETURNING id"
        ).fetchone()  # type: ignore[misc]  # RETURNING the row just written: never None
        with pytest.raises(errors.InsufficientPrivilege, match="that move is role triage_review's"):
            conn.execute("UPDATE triage.jobs SET status = 'terminal_failed' WHERE id = %s", (job_id,))
        with pytest.raises(errors.InsufficientPrivilege, match="permission denied for function"):
            conn.execute("SELECT * FROM triage.drop_expired_partitions('job_events', now())")
    with connect(server, "triage_review", migrated) as conn:
        conn.execute("UPDATE triage.jobs SET status = 'terminal_failed' WHERE id = %s", (job_id,))
        logged = conn.execute("SELECT login FROM triage.job_events WHERE job_id = %s ORDER BY id", (job_id,)).fetchall()
    assert logged == [("triage_app",), ("triage_review",)]
    with connect(server, "triage_maintenance", migrated) as conn:
        assert conn.execute("SELECT count(*) FROM triage.drop_expired_partitions('job_events', now())").fetchone() == (
            0,
        )


def test_on_compose_the_app_role_cannot_delete_a_day_of_the_log_directly(server: str, migrated: str) -> None:
    """compose's default privileges gave the app role every row privilege on each day partition
    the owner's function made (a DELETE on a partition skips the parent's append-only trigger);
    0022 and the partition function take them back."""
    with connect(server, "triage", migrated) as owner:
        owner.execute("ALTER DEFAULT PRIVILEGES IN SCHEMA triage GRANT ALL ON TABLES TO triage_app")  # as compose
        days = [r[0] for r in owner.execute("SELECT * FROM triage.ensure_day_partitions(9)").fetchall()]
        parts = [
            r[0]
            for r in owner.execute(
                "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'triage.job_events'::regclass AND c.relname LIKE 'job_events_p%'"
            ).fetchall()
        ]
    assert days
    assert parts
    with connect(server, "triage_app", migrated) as conn:
        for part in [*parts, "job_events_default"]:
            with pytest.raises(errors.InsufficientPrivilege):
                conn.execute(f"DELETE FROM triage.{part}")
