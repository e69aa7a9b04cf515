"""The SECURITY DEFINER jobs triggers cannot be borrowed by the app role (migration 0005).

Until 0005 a session of ``triage_worker`` could create a TEMP table, attach
``triage.jobs_check_insert()`` / ``jobs_check_update()`` to it and (a) write ``job_events`` rows
for any job, transition and actor, or (b) give the table a column of its own temp enum with an
implicit cast to uuid, which the function ran as its owner (a superuser on the embedded server).
Each layer of the fix is tested alone, with the layers in front of it opened on purpose, so a
regression of any one of them shows; every attack runs as the worker over its own login.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest
from psycopg import errors

from triage import migrations
from triage.database import DatabaseUrl
from triage.roles import (
    APP_ROLE,
    LEDGER_OWNER_ROLE,
    MAINTAINER_ROLE,
    MAINTENANCE_ROLE,
    WORKER_ROLE,
    ensure_worker_role,
    worker_url,
)

FORGED_JOB = uuid.UUID(int=42)
FAKE_JOBS = (
    "CREATE TEMP TABLE fake_jobs (id {id_type}, status triage.job_status, step text, attempt int,"
    " status_reason text, lease_owner text)"
)
# The attacker's cast runs as whoever evaluates it: it tries to make the worker a superuser, then
# raises so the test sees that it ran (and the statement, ALTER ROLE included, is rolled back).
SMUGGLED_CAST = (
    "CREATE TYPE pg_temp.smuggled AS ENUM ('x')",
    "CREATE FUNCTION pg_temp.as_owner(pg_temp.smuggled) RETURNS uuid LANGUAGE plpgsql AS $$ BEGIN"
    " EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);"
    " RAISE EXCEPTION 'smuggled cast ran as %', current_user; END $$",
    "CREATE CAST (pg_temp.smuggled AS uuid) WITH FUNCTION pg_temp.as_owner(pg_temp.smuggled) AS IMPLICIT",
)
ON_INSERT = (
    "CREATE TRIGGER borrowed AFTER INSERT ON fake_jobs REFERENCING NEW TABLE AS new_rows"
    " FOR EACH STATEMENT EXECUTE FUNCTION triage.jobs_check_insert()"
)
ON_UPDATE = (
    "CREATE TRIGGER borrowed AFTER UPDATE ON fake_jobs REFERENCING OLD TABLE AS old_rows"
    " NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION triage.jobs_check_update()"
)

# Each attack: the statements in order; the last one fires the borrowed function.
FORGE_CREATED_EVENT = (
    FAKE_JOBS.format(id_type="uuid"),
    ON_INSERT,
    "SET triage.actor = 'forged-reviewer'",
    f"INSERT INTO fake_jobs VALUES ('{FORGED_JOB}', 'queued', 'classify', 0, 'forged', NULL)",
)
ATTACKS = [
    pytest.param(FORGE_CREATED_EVENT, id="forge-created-event"),
    pytest.param(
        (
            FAKE_JOBS.format(id_type="uuid"),
            f"INSERT INTO fake_jobs VALUES ('{FORGED_JOB}', 'running', 'classify', 1, NULL, 'w')",
            ON_UPDATE,
            "UPDATE fake_jobs SET status = 'completed', status_reason = 'forged', lease_owner = 'forged-worker'",
        ),
        id="forge-transition-event",
    ),
    pytest.param(
        (
            *SMUGGLED_CAST,
            FAKE_JOBS.format(id_type="pg_temp.smuggled"),
            ON_INSERT,
            "INSERT INTO fake_jobs VALUES ('x', 'queued', 'classify', 0, NULL, NULL)",
        ),
        id="smuggled-cast-on-insert",
    ),
    pytest.param(
        (
            *SMUGGLED_CAST,
            FAKE_JOBS.format(id_type="pg_temp.smuggled"),
            "INSERT INTO fake_jobs VALUES ('x', 'running', 'classify', 1, NULL, 'w')",
            ON_UPDATE,
            "UPDATE fake_jobs SET status = 'completed'",
        ),
        id="smuggled-cast-on-update",
    ),
]


def connect(url: DatabaseUrl) -> psycopg.Connection:
    return psycopg.connect(url.libpq(), autocommit=True)


@pytest.fixture
def app_url(pg_server: DatabaseUrl, db_url: DatabaseUrl) -> DatabaseUrl:
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    ensure_worker_role(pg_server)
    return worker_url(db_url)


@pytest.fixture(scope="module")
def migrated(pg_server: DatabaseUrl) -> Iterator[DatabaseUrl]:
    """A database the migrations themselves built: a database's ACL (TEMP) is not cloned from
    the template, so the tests of TEMP need their own."""
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    name = f"triage_definer_{uuid.uuid4().hex[:12]}"
    with connect(pg_server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = pg_server.with_database(name)
    migrations.upgrade(url)
    ensure_worker_role(pg_server)
    yield url
    with connect(pg_server) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _attack(url: DatabaseUrl, statements: tuple[str, ...]) -> None:
    with connect(url) as conn:
        for statement in statements:
            conn.execute(statement)


def _is_superuser(url: DatabaseUrl, role: str) -> bool:
    with connect(url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
    return bool(row and row[0])


MAINTENANCE_FUNCTIONS = (
    "drop_expired_partitions",
    "ensure_day_partitions",
    "purge_classifications",
    "purge_reconciliation_runs",
)


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("CREATE TEMP TABLE t (id int)", id="temp-table"),
        pytest.param("CREATE TABLE pg_temp.t (id int)", id="table-in-pg-temp"),
        pytest.param("CREATE TYPE pg_temp.e AS ENUM ('x')", id="temp-type"),
        pytest.param("CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'", id="temp-function"),
        pytest.param("CREATE TEMP VIEW v AS SELECT 1", id="temp-view"),
    ],
)
def test_layer_1_the_app_role_may_create_no_temp_object(migrated: DatabaseUrl, statement: str) -> None:
    with connect(worker_url(migrated)) as conn, pytest.raises(errors.InsufficientPrivilege, match="temporary"):
        conn.execute(statement)


def test_layer_1_nobody_but_the_owner_has_temp_or_create_anywhere(migrated: DatabaseUrl) -> None:
    with connect(migrated) as conn:
        temp = conn.execute(
            "SELECT r, has_database_privilege(r, current_database(), 'TEMPORARY')"
            " FROM unnest(ARRAY['public', %s, %s, %s]) AS r",
            (APP_ROLE, WORKER_ROLE, LEDGER_OWNER_ROLE),
        ).fetchall()
        create = conn.execute(
            "SELECT r, n.nspname FROM unnest(ARRAY[%s, %s, %s]) AS r, pg_namespace n"
            " WHERE has_schema_privilege(r, n.oid, 'CREATE')",
            (APP_ROLE, WORKER_ROLE, LEDGER_OWNER_ROLE),
        ).fetchall()
    assert [r for r, allowed in temp if allowed] == []
    assert create == []


@pytest.mark.parametrize("statements", ATTACKS)
def test_layer_2_the_app_role_may_not_attach_the_trigger_functions(
    db_url: DatabaseUrl, app_url: DatabaseUrl, statements: tuple[str, ...]
) -> None:
    """TEMP granted again (as before 0005): the role has no EXECUTE on the functions."""
    with connect(db_url) as admin:
        admin.execute(f'GRANT TEMPORARY ON DATABASE "{db_url.database}" TO {APP_ROLE}')
    with pytest.raises(errors.InsufficientPrivilege, match="permission denied for function"):
        _attack(app_url, statements)
    assert not _is_superuser(db_url, WORKER_ROLE)


@pytest.mark.parametrize("statements", ATTACKS)
def test_layer_3_a_borrowed_trigger_function_refuses_any_table_but_jobs(
    db_url: DatabaseUrl, app_url: DatabaseUrl, statements: tuple[str, ...]
) -> None:
    """TEMP and EXECUTE granted (a careless ``GRANT EXECUTE ON ALL FUNCTIONS``): the body refuses
    before it reads a row, so the smuggled cast never runs and no event is written."""
    with connect(db_url) as admin:
        admin.execute(f'GRANT TEMPORARY ON DATABASE "{db_url.database}" TO {APP_ROLE}')
        admin.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA triage TO {APP_ROLE}")
    with pytest.raises(errors.InsufficientPrivilege, match=r"of triage\.jobs only: refused as trigger borrowed"):
        _attack(app_url, statements)
    assert not _is_superuser(db_url, WORKER_ROLE)
    with connect(db_url) as admin:
        assert admin.execute("SELECT count(*) FROM triage.job_events").fetchone() == (0,)


def test_layer_4_the_trigger_functions_are_pinned_closed_and_owned_by_the_ledger_role(db_url: DatabaseUrl) -> None:
    """Every SECURITY DEFINER function of the schema, so that a new one cannot forget a layer."""
    with connect(db_url) as conn:
        rows = conn.execute(
            "SELECT p.proname, pg_get_userbyid(p.proowner), p.proconfig,"
            " has_function_privilege('public', p.oid, 'EXECUTE'), has_function_privilege(%s, p.oid, 'EXECUTE')"
            " FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
            " WHERE n.nspname = 'triage' AND p.prosecdef ORDER BY 1",
            (APP_ROLE,),
        ).fetchall()
        ledger = conn.execute(
            "SELECT rolcanlogin, rolsuper, rolcreaterole, rolcreatedb, rolbypassrls, rolreplication,"
            " (SELECT count(*) FROM pg_auth_members m WHERE m.member = r.oid)"
            " FROM pg_roles r WHERE rolname = %s",
            (LEDGER_OWNER_ROLE,),
        ).fetchone()
    triggers = [r for r in rows if r[0] not in MAINTENANCE_FUNCTIONS]
    assert [r[0] for r in triggers] == ["jobs_check_insert", "jobs_check_update"]
    for _, owner, config, public_may, app_may in triggers:
        assert owner == LEDGER_OWNER_ROLE
        assert {"search_path=pg_catalog, triage, pg_temp", "TimeZone=UTC", "DateStyle=ISO, YMD"} <= set(config)
        assert (public_may, app_may) == (False, False)
    # The retention functions (0022) are the maintenance role's alone: pinned (time zone and date
    # style too: issue #25), closed to everyone else, owned by the tables' owner.
    maintenance = [r for r in rows if r[0] in MAINTENANCE_FUNCTIONS]
    assert sorted(r[0] for r in maintenance) == sorted(MAINTENANCE_FUNCTIONS)
    for name, owner, config, public_may, app_may in maintenance:
        assert owner != LEDGER_OWNER_ROLE
        assert {"search_path=pg_catalog, triage, pg_temp", "TimeZone=UTC", "DateStyle=ISO, YMD"} <= set(config)
        assert (public_may, app_may) == (False, False), name
    with connect(db_url) as conn:
        granted = conn.execute(
            "SELECT DISTINCT r.rolname FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace,"
            " pg_roles r WHERE n.nspname = 'triage' AND p.proname = ANY(%s)"
            " AND has_function_privilege(r.oid, p.oid, 'EXECUTE') AND NOT r.rolsuper"
            " AND NOT pg_has_role(r.oid, p.proowner, 'USAGE')",
            (list(MAINTENANCE_FUNCTIONS),),
        ).fetchall()
    assert {r[0] for r in granted} <= {MAINTENANCE_ROLE, MAINTAINER_ROLE}
    assert ledger == (False, False, False, False, False, False, 0)  # and a member of no role


@pytest.mark.parametrize(
    "statement",
    [
        pytest.param("SELECT count(*) FROM triage.jobs", id="read-jobs"),
        pytest.param("SELECT count(*) FROM triage.job_events", id="read-events"),
        pytest.param("SELECT count(*) FROM triage.manual_review", id="read-reviews"),
        pytest.param("UPDATE triage.jobs SET status = 'completed'", id="move-jobs"),
        pytest.param("DELETE FROM triage.job_events", id="delete-events"),
        pytest.param("TRUNCATE triage.job_events", id="truncate-events"),
        pytest.param("INSERT INTO triage.job_transitions VALUES ('completed', 'queued')", id="add-transition"),
        pytest.param("ALTER TABLE triage.job_events DISABLE TRIGGER ALL", id="disable-triggers"),
        pytest.param("CREATE TABLE triage.backdoor (id int)", id="create-in-triage"),
        pytest.param("CREATE TEMP TABLE backdoor (id int)", id="create-temp"),
        pytest.param(
            "CREATE OR REPLACE FUNCTION triage.jobs_check_insert() RETURNS trigger LANGUAGE plpgsql"
            " AS 'BEGIN RETURN NULL; END'",
            id="replace-trigger-body",
        ),
        pytest.param(f"ALTER ROLE {WORKER_ROLE} SUPERUSER", id="make-superuser"),
        pytest.param(f"GRANT {APP_ROLE} TO {LEDGER_OWNER_ROLE}", id="join-app-role"),
    ],
)
def test_layer_4_even_a_borrowed_call_could_only_write_the_log(migrated: DatabaseUrl, statement: str) -> None:
    """What code running as the functions' owner could do: insert into job_events, nothing else."""
    with connect(migrated) as conn:
        conn.execute(f"SET ROLE {LEDGER_OWNER_ROLE}")
        with pytest.raises(errors.InsufficientPrivilege):
            conn.execute(statement)


# -- the real triggers still fire, before and after the upgrade ----------------------------------


def _events(url: DatabaseUrl, job_id: uuid.UUID) -> list[tuple[str | None, str, str, str | None]]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT from_status::text, to_status::text, actor, reason FROM triage.job_events"
            " WHERE job_id = %s ORDER BY id",
            (job_id,),
        ).fetchall()
    return [tuple(r) for r in rows]


def test_the_real_triggers_log_each_move_with_its_actor(app_url: DatabaseUrl) -> None:
    """As the worker: the actor set for the transaction, else the lease owner, else the login;
    an unlisted move is still refused (refuse_transition runs as the ledger role)."""
    with connect(app_url) as conn:
        row = conn.execute(
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
            " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'queued', 3) RETURNING id"
        ).fetchone()
        assert row is not None
        job_id = row[0]
        conn.execute(
            "UPDATE triage.jobs SET status = 'running', attempt = 1, lease_owner = 'w1',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '1 minute'"
        )
        with conn.transaction():
            conn.execute("SET LOCAL triage.actor = 'alice'")
            conn.execute("SET LOCAL triage.reason = 'looked at it'")
            conn.execute(
                "UPDATE triage.jobs SET status = 'manual_review', lease_owner = NULL, lease_token = NULL,"
                " lease_expires_at = NULL"
            )
        with pytest.raises(errors.CheckViolation, match="cannot move from manual_review to running"):
            conn.execute(
                "UPDATE triage.jobs SET status = 'running', lease_owner = 'w2', lease_token = gen_random_uuid(),"
                " lease_expires_at = now() + interval '1 minute'"
            )
    assert _events(app_url, job_id) == [
        (None, "queued", WORKER_ROLE, None),
        ("queued", "running", "w1", None),
        ("running", "manual_review", "alice", "looked at it"),
    ]


@pytest.fixture
def at_0004(pg_server: DatabaseUrl, fresh_database: DatabaseUrl) -> DatabaseUrl:
    if not pg_server.is_socket:
        pytest.skip("the worker role logs in without a password: needs the embedded (trusting) server")
    migrations.upgrade(fresh_database, "0004")
    ensure_worker_role(pg_server)
    return fresh_database


def _owners(url: DatabaseUrl) -> set[str]:
    with connect(url) as conn:
        rows = conn.execute(
            "SELECT DISTINCT pg_get_userbyid(proowner) FROM pg_proc"
            " WHERE oid IN ('triage.jobs_check_insert'::regproc, 'triage.jobs_check_update'::regproc)"
        ).fetchall()
    return {r[0] for r in rows}


def test_upgrade_from_0004_keeps_jobs_in_flight_moving_and_logged(at_0004: DatabaseUrl) -> None:
    """Jobs registered and claimed at 0004 finish after the upgrade, each move logged once.

    The moves are plain SQL of the app role, as a 0004-era worker wrote them: today's store
    speaks the head schema (later revisions add columns), so it cannot run against 0004.
    """
    worker = worker_url(at_0004)
    ids = [uuid.uuid4(), uuid.uuid4()]
    with connect(worker) as conn, conn.transaction():
        conn.execute("SELECT set_config('triage.actor', 'triage', true)")
        for n, job_id in enumerate(ids):
            conn.execute(
                "INSERT INTO triage.jobs (id, idempotency_key, source, external_id, content_sha256, payload_ref,"
                " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
                " VALUES (%s, %s, 's', %s, 'h', 'ref', 'v', 'c', 'b', 'classify', 'queued', 3)",
                (job_id, f"inflight-{n}", f"inflight-{n}"),
            )
    with connect(worker) as conn:  # the claim: no actor set, so the lease owner is the actor
        conn.execute(
            "UPDATE triage.jobs SET status = 'running', attempt = 1, lease_owner = 'w-before',"
            " lease_token = gen_random_uuid(), lease_expires_at = now() + interval '60 seconds'"
            " WHERE id = ANY(%s)",
            (ids,),
        )
    migrations.upgrade(at_0004)
    assert _owners(at_0004) == {LEDGER_OWNER_ROLE}
    done, review = ids
    with connect(worker) as conn:
        for job_id, last in ((done, "completed"), (review, "manual_review")):
            moved = conn.execute(
                "UPDATE triage.jobs SET status = %s::triage.job_status, lease_owner = NULL, lease_token = NULL,"
                " lease_expires_at = NULL WHERE id = %s AND status = 'running'",
                (last, job_id),
            ).rowcount
            assert moved == 1
    for job_id, last in ((done, "completed"), (review, "manual_review")):
        moves = [(f, t, a) for f, t, a, _ in _events(at_0004, job_id)]
        assert moves == [(None, "queued", "triage"), ("queued", "running", "w-before"), ("running", last, "w-before")]
    with pytest.raises(errors.InsufficientPrivilege):  # and the upgraded database is closed
        _attack(worker_url(at_0004), FORGE_CREATED_EVENT)


def test_downgrade_to_0004_gives_the_functions_back_and_up_again(at_0004: DatabaseUrl) -> None:
    migrations.upgrade(at_0004)
    migrations.downgrade(at_0004, "0004")
    assert _owners(at_0004) == {"postgres"}
    with connect(at_0004) as conn:
        held = conn.execute(
            "SELECT has_table_privilege(%s, 'triage.job_events', 'INSERT'),"
            " has_schema_privilege(%s, 'triage', 'USAGE')",
            (LEDGER_OWNER_ROLE, LEDGER_OWNER_ROLE),
        ).fetchone()
    assert held == (False, False)
    with connect(worker_url(at_0004)) as conn:  # 0004's triggers fire again
        conn.execute(
            "INSERT INTO triage.jobs (idempotency_key, source, external_id, content_sha256, payload_ref,"
            " classifier_version, correlation_id, batch_key, step, status, max_attempts)"
            " VALUES ('k', 's', 'e', 'h', 'ref', 'v', 'c', 'b', 'classify', 'queued', 3)"
        )
        assert conn.execute("SELECT actor FROM triage.job_events").fetchall() == [(WORKER_ROLE,)]
    migrations.upgrade(at_0004)
    assert _owners(at_0004) == {LEDGER_OWNER_ROLE}
