"""The jobs triggers cannot be borrowed: guarded bodies, no EXECUTE, a powerless owner, no TEMP.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

0004 made ``jobs_check_insert()`` and ``jobs_check_update()`` ``SECURITY DEFINER``, but left
them executable by PUBLIC, and their bodies trusted whatever table fired them. The app role
could therefore create a TEMP table, attach either function to it as a trigger, and (a) write
``job_events`` rows for any job, transition and actor; (b) give that table a column of its own
temp enum with an implicit cast to uuid, whose function the body then ran as the owner (a
superuser on the embedded server). This revision closes it the way PostgreSQL's "Writing
SECURITY DEFINER Functions Safely" asks, in layers that each stop both attacks alone:

1. EXECUTE on the two functions is revoked from PUBLIC and ``triage_app``: nobody but their
   owner can attach them to a table (firing the real triggers checks no EXECUTE).
2. Each body first refuses any table but ``triage.jobs`` (``TG_RELID``), before it looks at a
   single row, so the row types are always the jobs table's; every type, cast and operator in
   the bodies is schema-qualified and ``search_path`` is ``pg_catalog, triage, pg_temp``, with
   ``pg_temp`` last so a temp object can never shadow anything.
3. The functions belong to ``triage_ledger_owner``: NOLOGIN, no superuser, and allowed only
   to read ``job_transitions`` and insert into ``job_events``. A borrowed call could write log
   rows, or alter or drop these two functions (every owner may), and nothing else: no job
   moves, no reads of documents, no rewrite of history, no new object.
4. TEMP on this database is revoked from PUBLIC and ``triage_app``: the app role cannot create
   a temp table, type, cast or function at all (Triage never uses temp objects).

The owner role is cluster-wide and created here if missing (needs CREATEROLE, like 0003's
role). A migrating user that is not a superuser must be a member of it, with SET and INHERIT
(a superuser's plain GRANT gives both), to hand it the functions and take them back;
docker/postgres-init/01-triage.sql creates it and grants it to ``triage``, and a CREATEROLE
creator grants itself the options. Otherwise the migration stops with the GRANT to run once
as a superuser. The TEMP
revocation needs the database's owner; another migrating user gets a warning instead.

The downgrade gives the functions back to the migrating user with 0004's bodies (what 0004's
own downgrade needs) and revokes the owner role's privileges in this database, leaving the
role to the cluster. It keeps EXECUTE and TEMP revoked: no earlier revision needs them, and
granting them back would only reopen the hole.

Frozen history: the bodies below are stated as made here; this file imports no current code.
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
LEDGER = "triage_ledger_owner"
FUNCTIONS = (f"{S}.jobs_check_insert()", f"{S}.jobs_check_update()")
REFUSE_TRANSITION = f"{S}.refuse_transition(uuid, {S}.job_status, {S}.job_status)"

CREATE_LEDGER = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{LEDGER}') THEN
        CREATE ROLE {LEDGER} NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'role {LEDGER} does not exist and % may not create it', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'create it once as a superuser (CREATE ROLE {LEDGER} NOLOGIN; '
                         'GRANT {LEDGER} TO ' || current_user || ') or grant CREATEROLE to the '
                         'migrating user, then run the migration again';
END
$$
"""

# What the trigger bodies read and write, and nothing else (constants, never input).
LEDGER_GRANTS = (
    f"GRANT USAGE ON SCHEMA {S} TO {LEDGER}",
    f"GRANT SELECT ON {S}.job_transitions TO {LEDGER}",
    f"GRANT INSERT ON {S}.job_events TO {LEDGER}",
    f"GRANT EXECUTE ON FUNCTION {S}.current_actor(), {REFUSE_TRANSITION} TO {LEDGER}",
)

# A non-superuser may give an object away only to a role it can SET ROLE to (PostgreSQL 16;
# a member before), and only if that role may CREATE in the schema: CREATE is granted for the
# ALTER and taken back at once (one transaction, so no session ever sees it). Taking the
# functions back later (the downgrade, a later body) needs the role's privileges (INHERIT). A
# creator holding only ADMIN on the role (CREATEROLE, PostgreSQL 16) grants itself both first.
HAND_OVER = f"""
DO $$
DECLARE
    since_16 boolean := pg_catalog.current_setting('server_version_num')::pg_catalog.int4 >= 160000;
    usable boolean := pg_catalog.pg_has_role(current_user, '{LEDGER}', 'USAGE');
BEGIN
    IF usable AND since_16 THEN
        usable := pg_catalog.pg_has_role(current_user, '{LEDGER}', 'SET');
    END IF;
    IF NOT usable AND since_16 THEN
        EXECUTE pg_catalog.format('GRANT {LEDGER} TO %I WITH INHERIT TRUE, SET TRUE', current_user);
    ELSIF NOT usable THEN
        EXECUTE pg_catalog.format('GRANT {LEDGER} TO %I', current_user);
    END IF;
    GRANT CREATE ON SCHEMA {S} TO {LEDGER};
    ALTER FUNCTION {FUNCTIONS[0]} OWNER TO {LEDGER};
    ALTER FUNCTION {FUNCTIONS[1]} OWNER TO {LEDGER};
    REVOKE CREATE ON SCHEMA {S} FROM {LEDGER};
EXCEPTION WHEN insufficient_privilege OR invalid_grant_operation THEN
    RAISE EXCEPTION '% may not give the jobs triggers to {LEDGER}: %', current_user, SQLERRM
        USING ERRCODE = 'insufficient_privilege',
              HINT = 'run once as a superuser: GRANT {LEDGER} TO ' || current_user
                     || '; then run the migration again';
END
$$
"""

REVOKE_TEMP = f"""
DO $$
BEGIN
    EXECUTE pg_catalog.format('REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC', current_database());
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{APP}') THEN
        EXECUTE pg_catalog.format('REVOKE TEMPORARY ON DATABASE %I FROM {APP}', current_database());
    END IF;
EXCEPTION WHEN insufficient_privilege THEN
    RAISE WARNING '% does not own database %, so TEMP stays granted: revoke it as its owner '
                  '(REVOKE TEMPORARY ON DATABASE % FROM PUBLIC, {APP})',
                  current_user, current_database(), current_database();
END
$$
"""

# The guard runs before anything reads a row: only then are the row types triage.jobs's own,
# so no expression below can resolve a type, cast or operator the caller made.
GUARD = """
    IF TG_RELID OPERATOR(pg_catalog.<>) 'triage.jobs'::pg_catalog.regclass::pg_catalog.oid
       OR TG_OP OPERATOR(pg_catalog.<>) '{op}'::pg_catalog.text
       OR TG_LEVEL OPERATOR(pg_catalog.<>) 'STATEMENT'::pg_catalog.text
       OR TG_WHEN OPERATOR(pg_catalog.<>) 'AFTER'::pg_catalog.text THEN
        RAISE EXCEPTION 'triage.{function}() is the {op} trigger of triage.jobs only: refused as '
                        'trigger % on %.% (% % FOR EACH %)',
                        TG_NAME, TG_TABLE_SCHEMA, TG_TABLE_NAME, TG_WHEN, TG_OP, TG_LEVEL
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    actor := triage.current_actor();
    reason := pg_catalog.current_setting('triage.reason', true);
    IF reason OPERATOR(pg_catalog.=) ''::pg_catalog.text THEN
        reason := NULL;
    END IF;
"""

HARDENED = "SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp SET enable_nestloop = off"

# status is NOT NULL, so <> is IS DISTINCT FROM without its unqualified = operator.
CHECK_INSERT = f"""
CREATE OR REPLACE FUNCTION triage.jobs_check_insert() RETURNS trigger LANGUAGE plpgsql
{HARDENED} AS $$
DECLARE
    actor pg_catalog.text;
    reason pg_catalog.text;
BEGIN
{GUARD.format(function="jobs_check_insert", op="INSERT")}
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    SELECT n.id, NULL, n.status, n.step, n.attempt, coalesce(actor, session_user::pg_catalog.text),
           coalesce(reason, n.status_reason)
      FROM new_rows n
      LEFT JOIN triage.job_transitions t
             ON t.from_status IS NULL AND t.to_status OPERATOR(pg_catalog.=) n.status
     WHERE CASE WHEN t.to_status IS NOT NULL THEN true
                ELSE triage.refuse_transition(n.id, NULL::triage.job_status, n.status) END;
    RETURN NULL;
END
$$
"""

CHECK_UPDATE = f"""
CREATE OR REPLACE FUNCTION triage.jobs_check_update() RETURNS trigger LANGUAGE plpgsql
{HARDENED} AS $$
DECLARE
    actor pg_catalog.text;
    reason pg_catalog.text;
BEGIN
{GUARD.format(function="jobs_check_update", op="UPDATE")}
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    -- A lease holder's own writes (claim, outcomes) need no SET: the lease owner is the actor.
    SELECT n.id, o.status, n.status, n.step, n.attempt,
           coalesce(actor, n.lease_owner, o.lease_owner, session_user::pg_catalog.text),
           coalesce(reason, n.status_reason)
      FROM old_rows o
      JOIN new_rows n ON n.id OPERATOR(pg_catalog.=) o.id
      LEFT JOIN triage.job_transitions t
             ON t.from_status OPERATOR(pg_catalog.=) o.status
            AND t.to_status OPERATOR(pg_catalog.=) n.status
     WHERE n.status OPERATOR(pg_catalog.<>) o.status
       AND CASE WHEN t.to_status IS NOT NULL THEN true
                ELSE triage.refuse_transition(n.id, o.status, n.status) END;
    RETURN NULL;
END
$$
"""

# 0004's bodies, verbatim, for the downgrade.
CHECK_INSERT_0004 = """
CREATE OR REPLACE FUNCTION triage.jobs_check_insert() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_nestloop = off AS $$
DECLARE
    actor text := triage.current_actor();
    reason text := nullif(current_setting('triage.reason', true), '');
BEGIN
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    SELECT n.id, NULL, n.status, n.step, n.attempt, coalesce(actor, session_user::text),
           coalesce(reason, n.status_reason)
      FROM new_rows n
      LEFT JOIN triage.job_transitions t ON t.from_status IS NULL AND t.to_status = n.status
     WHERE CASE WHEN t.to_status IS NOT NULL THEN true
                ELSE triage.refuse_transition(n.id, NULL, n.status) END;
    RETURN NULL;
END
$$
"""

CHECK_UPDATE_0004 = """
CREATE OR REPLACE FUNCTION triage.jobs_check_update() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp SET enable_nestloop = off AS $$
DECLARE
    actor text := triage.current_actor();
    reason text := nullif(current_setting('triage.reason', true), '');
BEGIN
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    -- A lease holder's own writes (claim, outcomes) need no SET: the lease owner is the actor.
    SELECT n.id, o.status, n.status, n.step, n.attempt,
           coalesce(actor, n.lease_owner, o.lease_owner, session_user::text),
           coalesce(reason, n.status_reason)
      FROM old_rows o
      JOIN new_rows n ON n.id = o.id
      LEFT JOIN triage.job_transitions t ON t.from_status = o.status AND t.to_status = n.status
     WHERE n.status IS DISTINCT FROM o.status
       AND CASE WHEN t.to_status IS NOT NULL THEN true
                ELSE triage.refuse_transition(n.id, o.status, n.status) END;
    RETURN NULL;
END
$$
"""


def _if_role(role: str, statement: str) -> str:
    return f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN
        {statement};
    END IF;
END
$$
"""


def upgrade() -> None:
    op.execute(CREATE_LEDGER)
    for grant in LEDGER_GRANTS:
        op.execute(grant)
    # CREATE OR REPLACE needs the owner; after a half-done manual run the owner may already be
    # the ledger role (whose member the migrating user then is).
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
    op.execute(CHECK_INSERT)
    op.execute(CHECK_UPDATE)
    for function in FUNCTIONS:
        op.execute(f"REVOKE ALL ON FUNCTION {function} FROM PUBLIC")
        op.execute(_if_role(APP, f"REVOKE ALL ON FUNCTION {function} FROM {APP}"))
    op.execute(HAND_OVER)
    op.execute(REVOKE_TEMP)


def downgrade() -> None:
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
    op.execute(CHECK_INSERT_0004)
    op.execute(CHECK_UPDATE_0004)
    op.execute(
        _if_role(
            LEDGER,
            f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {LEDGER};"
            f" REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {S} FROM {LEDGER};"
            f" REVOKE ALL ON SCHEMA {S} FROM {LEDGER}",
        )
    )
