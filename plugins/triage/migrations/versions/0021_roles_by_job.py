"""Each login does one job and PostgreSQL refuses the rest: a review role, a maintenance role,
the owner of each transition, the login in the log, and labels only from the taxonomy.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-05

Until now every worker, the API server and the review DAG logged in as members of
``triage_app``: it could resolve a review as anyone (``triage.actor`` is a session setting),
write a label outside the taxonomy by raw SQL (checked only in Python), and run retention with a
horizon of its choosing (issue #25). Here:

- Two more group roles, NOLOGIN, made if missing (CREATEROLE, as 0003's): ``triage_review`` (the
  web service and ``review_jobs``: the only role that moves jobs out of ``manual_review`` and
  writes reviewers' decisions and labels) and ``triage_maintenance`` (``triage_maintenance``:
  the only role that runs retention; its grants are 0022's, with the functions).
- ``transition_roles``: which role owns each allowed transition (data beside
  ``job_transitions``, frozen like it). The jobs triggers now refuse a move unless the session's
  login (``session_user``) is a member of the move's role, or of the tables' owner (the
  migrating user, and superusers, may do anything anyway), with an error naming the login, the
  move and its role (``insufficient_privilege``, constraint ``job_transition_role``).
- ``job_events.login``: the session's login beside the actor (the actor is a setting anyone may
  set; the login is the database's own word). Rows before this revision have none.
- ``taxonomy_labels``: the labels of the taxonomy file, kept in step by ``triage migrate``
  (``triage.migrations.upgrade``): added, and retired (never deleted: old rows still name them).
  ``document_labels`` refuses a label that is not an active one, and a reviewer's label
  (``classifier_version`` ``human:…``) from any login but the review role's; ``manual_review``
  refuses a decision (``labelled``, ``requeued``, ``rejected``: a new one or a change to one)
  from any login but the review role's, and a ``labelled`` decision whose label is not active.
- The two trigger functions pin ``TimeZone`` and ``DateStyle`` too, as every ``SECURITY DEFINER``
  function of the schema now does; and a move out of a terminal state (a replay of
  ``terminal_failed``, the one way a closed job opens again) takes retention's advisory lock
  shared without waiting, and is refused (``lock_not_available``, constraint
  ``job_reopen_during_retention``) while retention decides which days to drop (0022).

Frozen history: this file states the change as made here and imports no current code (it reads
0003's role statement and 0005's bodies and hand-over from those revisions' own files).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"
REVIEW = "triage_review"
MAINTENANCE = "triage_maintenance"
LEDGER = "triage_ledger_owner"
FUNCTIONS = (f"{S}.jobs_check_insert()", f"{S}.jobs_check_update()")

# The review role's moves; every other move of job_transitions is the app role's.
REVIEW_MOVES = (
    ("manual_review", "queued"),
    ("manual_review", "completed"),
    ("manual_review", "terminal_failed"),
    ("terminal_failed", "queued"),
)
DECISIONS = "'labelled', 'requeued', 'rejected'"


def _create_role(role: str) -> str:
    """0003's statement for ``role``: made NOLOGIN if missing (racing migrations of other
    databases tolerated); without CREATEROLE, the statement to run once as a superuser."""
    return str(_revision("0003_app_role.py").CREATE_ROLE).replace(APP, role)


def _if_role(role: str, statement: str) -> str:
    return (
        f"DO $$ BEGIN IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{role}') THEN "
        f"{statement}; END IF; END $$"
    )


# What the review role does: read the ledger (the pages, the reports), decide (jobs, their review
# rows, their events and labels) and replay by filter. Nothing else.
REVIEW_GRANTS = (
    f"GRANT USAGE ON SCHEMA {S} TO {REVIEW}",
    f"GRANT SELECT ON ALL TABLES IN SCHEMA {S} TO {REVIEW}",
    f"GRANT UPDATE ON {S}.jobs, {S}.manual_review TO {REVIEW}",
    f"GRANT INSERT ON {S}.outbox TO {REVIEW}",
    f"GRANT INSERT, UPDATE ON {S}.document_labels, {S}.replay_requests TO {REVIEW}",
    f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {S} TO {REVIEW}",
)

TABLES = f"""
CREATE TABLE {S}.transition_roles (
    from_status {S}.job_status,
    to_status {S}.job_status NOT NULL,
    role text NOT NULL,
    CONSTRAINT transition_roles_from_status_to_status_key UNIQUE NULLS NOT DISTINCT (from_status, to_status),
    CONSTRAINT transition_roles_role_check CHECK (role IN ('{APP}', '{REVIEW}'))
);
COMMENT ON TABLE {S}.transition_roles IS
    'Which role owns each move of job_transitions: the jobs triggers refuse it to any other login';
CREATE TRIGGER transition_roles_frozen BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON {S}.transition_roles
    FOR EACH STATEMENT EXECUTE FUNCTION {S}.refuse_change('transition owners change only by migration');

CREATE TABLE {S}.taxonomy_labels (
    name text NOT NULL,
    added_at timestamptz NOT NULL DEFAULT now(),
    retired_at timestamptz,
    CONSTRAINT taxonomy_labels_pkey PRIMARY KEY (name),
    CONSTRAINT taxonomy_labels_name_check CHECK (name ~ '^[a-z][a-z0-9_]{{0,63}}$')
);
COMMENT ON TABLE {S}.taxonomy_labels IS
    'The taxonomy file''s labels, kept in step by triage migrate; retired ones stay for old rows';
"""

# Who the session is: its login, and whether the login may act as a role (membership with its
# privileges, or the tables' owner's: the migrating user, and superusers, may do anything).
LOGIN_MAY = f"""
CREATE FUNCTION {S}.login_may(role_name text) RETURNS boolean
LANGUAGE sql STABLE SET search_path = pg_catalog, pg_temp AS $$
    SELECT EXISTS (SELECT FROM pg_catalog.pg_roles r
                    WHERE r.rolname OPERATOR(pg_catalog.=) role_name::pg_catalog.name
                      AND pg_catalog.pg_has_role(session_user, r.oid, 'USAGE'))
        OR pg_catalog.pg_has_role(session_user,
                                  (SELECT c.relowner FROM pg_catalog.pg_class c
                                    WHERE c.oid OPERATOR(pg_catalog.=) 'triage.jobs'::pg_catalog.regclass),
                                  'USAGE')
$$;
COMMENT ON FUNCTION {S}.login_may(text) IS
    'Whether the session''s login (session_user) may act as role_name: a member of it, or of the tables'' owner';

CREATE FUNCTION {S}.refuse_move(job_id uuid, old_status {S}.job_status, new_status {S}.job_status, owner_role text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'login % may not move job % from % to %: that move is %', session_user, job_id,
                    coalesce(old_status::text, '<new>'), new_status,
                    coalesce('role ' || owner_role || '''s', 'no role''s')
        USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'job_transition_role',
              DETAIL = format('job_id=%s from=%s to=%s role=%s login=%s', job_id,
                              coalesce(old_status::text, '<new>'), new_status, owner_role, session_user);
END
$$;
COMMENT ON FUNCTION {S}.refuse_move(uuid, {S}.job_status, {S}.job_status, text) IS
    'Raises for a move the session''s login is no member of the owning role for; called by the jobs triggers.';

CREATE FUNCTION {S}.refuse_reopen(job_id uuid, old_status {S}.job_status, new_status {S}.job_status)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'job % cannot move from % to % right now: retention is deciding which days of its history '
                    'to keep; try again in a minute', job_id, old_status, new_status
        USING ERRCODE = 'lock_not_available', CONSTRAINT = 'job_reopen_during_retention';
END
$$;
"""

LEDGER_GRANTS = (
    f"GRANT SELECT ON {S}.transition_roles TO {LEDGER}",
    f"GRANT EXECUTE ON FUNCTION {S}.login_may(text) TO {LEDGER}",
    f"GRANT EXECUTE ON FUNCTION {S}.refuse_move(uuid, {S}.job_status, {S}.job_status, text) TO {LEDGER}",
    f"GRANT EXECUTE ON FUNCTION {S}.refuse_reopen(uuid, {S}.job_status, {S}.job_status) TO {LEDGER}",
)

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
    -- Asked once per statement: which owners of moves this login may act as.
    app_may := triage.login_may('triage_app'::pg_catalog.text);
    review_may := triage.login_may('triage_review'::pg_catalog.text);
"""

HARDENED = (
    "SECURITY DEFINER SET search_path = pg_catalog, triage, pg_temp SET enable_nestloop = off"
    " SET TimeZone = 'UTC' SET DateStyle = 'ISO, YMD'"
)

DECLARE = """
DECLARE
    actor pg_catalog.text;
    reason pg_catalog.text;
    app_may pg_catalog.bool;
    review_may pg_catalog.bool;
"""

# The role check after the transition check: a move that is not allowed at all says so first.
ALLOWED = """CASE WHEN t.to_status IS NULL THEN triage.refuse_transition(n.id, {old}, n.status)
                WHEN NOT coalesce((r.role OPERATOR(pg_catalog.=) 'triage_app'::pg_catalog.text AND app_may)
                                  OR (r.role OPERATOR(pg_catalog.=) 'triage_review'::pg_catalog.text AND review_may),
                                  false)
                     THEN triage.refuse_move(n.id, {old}, n.status, r.role){reopen}
                ELSE true END"""

# Retention (0022) decides whether a day of the log holds an open job's events while it holds this
# advisory lock exclusively. The only way a closed job opens again is a move out of a terminal
# state (a replay): such a move takes the lock shared, without waiting (its own row is already
# changed, invisible to retention's check), and is refused while retention holds it.
REOPEN_LOCK = 2520250001
REOPEN = f"""
                WHEN o.status OPERATOR(pg_catalog.=) ANY ('{{completed,terminal_failed}}'::triage.job_status[])
                     AND NOT pg_catalog.pg_try_advisory_xact_lock_shared({REOPEN_LOCK}::pg_catalog.int8)
                     THEN triage.refuse_reopen(n.id, o.status, n.status)"""

CHECK_INSERT = f"""
CREATE OR REPLACE FUNCTION triage.jobs_check_insert() RETURNS trigger LANGUAGE plpgsql
{HARDENED} AS $$
{DECLARE}
BEGIN
{GUARD.format(function="jobs_check_insert", op="INSERT")}
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason, login)
    SELECT n.id, NULL, n.status, n.step, n.attempt, coalesce(actor, session_user::pg_catalog.text),
           coalesce(reason, n.status_reason), session_user::pg_catalog.text
      FROM new_rows n
      LEFT JOIN triage.job_transitions t
             ON t.from_status IS NULL AND t.to_status OPERATOR(pg_catalog.=) n.status
      LEFT JOIN triage.transition_roles r
             ON r.from_status IS NULL AND r.to_status OPERATOR(pg_catalog.=) n.status
     WHERE {ALLOWED.format(old="NULL::triage.job_status", reopen="")};
    RETURN NULL;
END
$$
"""

CHECK_UPDATE = f"""
CREATE OR REPLACE FUNCTION triage.jobs_check_update() RETURNS trigger LANGUAGE plpgsql
{HARDENED} AS $$
{DECLARE}
BEGIN
{GUARD.format(function="jobs_check_update", op="UPDATE")}
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason, login)
    -- A lease holder's own writes (claim, outcomes) need no SET: the lease owner is the actor.
    SELECT n.id, o.status, n.status, n.step, n.attempt,
           coalesce(actor, n.lease_owner, o.lease_owner, session_user::pg_catalog.text),
           coalesce(reason, n.status_reason), session_user::pg_catalog.text
      FROM old_rows o
      JOIN new_rows n ON n.id OPERATOR(pg_catalog.=) o.id
      LEFT JOIN triage.job_transitions t
             ON t.from_status OPERATOR(pg_catalog.=) o.status
            AND t.to_status OPERATOR(pg_catalog.=) n.status
      LEFT JOIN triage.transition_roles r
             ON r.from_status OPERATOR(pg_catalog.=) o.status
            AND r.to_status OPERATOR(pg_catalog.=) n.status
     WHERE n.status OPERATOR(pg_catalog.<>) o.status
       AND {ALLOWED.format(old="o.status", reopen=REOPEN)};
    RETURN NULL;
END
$$
"""


def _revision(name: str) -> ModuleType:
    """An earlier revision's module, by its path (a revision's file is no importable module
    name): its statements in its own words, for the downgrade and the hand-over."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"triage_revision_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# Invoker functions: they only read and raise, so nothing is gained by borrowing them.
ROW_CHECKS = f"""
CREATE FUNCTION {S}.check_document_labels() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    outside text;
BEGIN
    SELECT n.label INTO outside FROM new_rows n
     WHERE NOT EXISTS (SELECT FROM triage.taxonomy_labels t WHERE t.name = n.label AND t.retired_at IS NULL)
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'label % is not in the taxonomy', quote_literal(outside)
            USING ERRCODE = 'check_violation', CONSTRAINT = 'document_labels_label_in_taxonomy',
                  HINT = 'triage.taxonomy_labels follows the taxonomy file: run triage migrate after changing it';
    END IF;
    IF EXISTS (SELECT FROM new_rows n WHERE n.classifier_version LIKE 'human:%')
       AND NOT triage.login_may('{REVIEW}') THEN
        RAISE EXCEPTION 'login % may not write a reviewer''s label: that is role {REVIEW}''s', session_user
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'document_labels_reviewer_label';
    END IF;
    RETURN NULL;
END
$$;

CREATE FUNCTION {S}.check_review_decision() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.resolution IN ({DECISIONS})
       AND (TG_OP = 'INSERT'
            OR (OLD.resolution, OLD.resolved_at, OLD.resolved_by, OLD.note, OLD.context)
               IS DISTINCT FROM (NEW.resolution, NEW.resolved_at, NEW.resolved_by, NEW.note, NEW.context)) THEN
        IF NOT triage.login_may('{REVIEW}') THEN
            RAISE EXCEPTION 'login % may not record a review decision (%) for job %: that is role {REVIEW}''s',
                            session_user, NEW.resolution, NEW.job_id
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'manual_review_decision_role';
        END IF;
        IF NEW.resolution = 'labelled' AND NOT EXISTS (
            SELECT FROM triage.taxonomy_labels t
             WHERE t.name = NEW.context ->> 'resolved_label' AND t.retired_at IS NULL) THEN
            RAISE EXCEPTION 'label % is not in the taxonomy', quote_literal(NEW.context ->> 'resolved_label')
                USING ERRCODE = 'check_violation', CONSTRAINT = 'manual_review_label_in_taxonomy';
        END IF;
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER document_labels_check_insert AFTER INSERT ON {S}.document_labels
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {S}.check_document_labels();
CREATE TRIGGER document_labels_check_update AFTER UPDATE ON {S}.document_labels
    REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION {S}.check_document_labels();
CREATE TRIGGER manual_review_check_decision BEFORE INSERT OR UPDATE ON {S}.manual_review
    FOR EACH ROW EXECUTE FUNCTION {S}.check_review_decision();
"""


def upgrade() -> None:
    op.execute(_create_role(REVIEW))
    op.execute(_create_role(MAINTENANCE))
    op.execute(TABLES)
    # Every move job_transitions allows today: the review role's four, the app role's the rest.
    review = " OR ".join(f"(from_status = '{a}' AND to_status = '{b}')" for a, b in REVIEW_MOVES)
    op.execute(f"ALTER TABLE {S}.transition_roles DISABLE TRIGGER transition_roles_frozen")
    op.execute(
        f"INSERT INTO {S}.transition_roles (from_status, to_status, role) SELECT from_status, to_status,"
        f" CASE WHEN {review} THEN '{REVIEW}' ELSE '{APP}' END FROM {S}.job_transitions"
    )
    op.execute(f"ALTER TABLE {S}.transition_roles ENABLE TRIGGER transition_roles_frozen")
    # A column with no default: only the catalog changes, whatever the log's size.
    op.execute(f"ALTER TABLE {S}.job_events ADD COLUMN login text")
    op.execute(f"COMMENT ON COLUMN {S}.job_events.login IS 'session_user of the move (NULL before 0021)'")

    op.execute(LOGIN_MAY)
    for grant in LEDGER_GRANTS:
        op.execute(grant)
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
    op.execute(CHECK_INSERT)
    op.execute(CHECK_UPDATE)
    op.execute(_revision("0005_ledger_owner.py").HAND_OVER)

    op.execute(ROW_CHECKS)

    # New tables are read-only to every deployment role (docker-compose's default privileges would
    # give the app role every row privilege on them).
    for table in ("transition_roles", "taxonomy_labels"):
        for role in (APP, REVIEW, MAINTENANCE):
            op.execute(_if_role(role, f"REVOKE ALL ON {S}.{table} FROM {role}"))
        op.execute(f"GRANT SELECT ON {S}.{table} TO {APP}, {REVIEW}")

    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {REVIEW}")
    for grant in REVIEW_GRANTS:
        op.execute(grant)


def downgrade() -> None:
    op.execute(f"DROP TRIGGER IF EXISTS manual_review_check_decision ON {S}.manual_review")
    op.execute(f"DROP TRIGGER IF EXISTS document_labels_check_update ON {S}.document_labels")
    op.execute(f"DROP TRIGGER IF EXISTS document_labels_check_insert ON {S}.document_labels")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.check_review_decision()")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.check_document_labels()")
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} OWNER TO CURRENT_USER")
    v0005 = _revision("0005_ledger_owner.py")
    op.execute(v0005.CHECK_INSERT)
    op.execute(v0005.CHECK_UPDATE)
    op.execute(v0005.HAND_OVER)
    op.execute(f"DROP FUNCTION IF EXISTS {S}.refuse_move(uuid, {S}.job_status, {S}.job_status, text)")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.refuse_reopen(uuid, {S}.job_status, {S}.job_status)")
    op.execute(f"DROP FUNCTION IF EXISTS {S}.login_may(text)")
    op.execute(f"ALTER TABLE {S}.job_events DROP COLUMN IF EXISTS login")
    op.execute(f"DROP TABLE IF EXISTS {S}.taxonomy_labels")
    op.execute(f"DROP TABLE IF EXISTS {S}.transition_roles")
    # The roles stay with the cluster; this database's grants go.
    for role in (REVIEW, MAINTENANCE):
        op.execute(
            _if_role(
                role,
                f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {role};"
                f" REVOKE ALL ON ALL SEQUENCES IN SCHEMA {S} FROM {role};"
                f" REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {S} FROM {role};"
                f" REVOKE ALL ON SCHEMA {S} FROM {role}",
            )
        )
