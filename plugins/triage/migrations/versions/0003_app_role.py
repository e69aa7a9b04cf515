"""The least-privilege role of the running DAGs: ``triage_app``, rows only, no DDL.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30

Migrations run as the owner of the schema; Airflow tasks connect as a member of
``triage_app`` (``triage_worker`` on the embedded server, ``triage_app`` itself in
docker-compose). The role gets USAGE on the schema (never CREATE), the row privileges each
table needs and nothing else: the transition log and the classifications are append-only
(INSERT and SELECT), jobs are never deleted, the transition table is read-only. Owning nothing,
the role cannot ALTER, DROP or TRUNCATE anything either.

The triggers of 0001 run as the caller (they are not SECURITY DEFINER): the INSERT into
``job_events`` they make is covered by the role's INSERT, and ``current_user`` in the log still
names the role that moved the job.

Roles are cluster-wide while migrations run per database: the role is created only if it does
not exist (which needs CREATEROLE; without it the migration stops with a hint to create the role
once as a superuser) (another database of the cluster, or docker/postgres-init/01-triage.sql, may have made
it), and the downgrade revokes this database's grants but leaves the role to the cluster.

Frozen history: this file states the grants as they were made and does not import the current
code. A later table must grant its own privileges in its own revision.
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"

# table -> privileges of the app role (constants: identifiers, never input)
PRIVILEGES = {
    "jobs": "SELECT, INSERT, UPDATE",
    "job_events": "SELECT, INSERT",
    "job_transitions": "SELECT",
    "classifications": "SELECT, INSERT",
    "document_labels": "SELECT, INSERT, UPDATE",
    "manual_review": "SELECT, INSERT, UPDATE",
    "outbox": "SELECT, INSERT, UPDATE",
    "reconciliation_runs": "SELECT, INSERT, UPDATE",
}

# A concurrent migration of another database may create the role between the check and the
# CREATE: that surfaces as unique_violation on pg_authid, not duplicate_object.
CREATE_ROLE = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{APP}') THEN
        CREATE ROLE {APP} NOLOGIN;
    END IF;
EXCEPTION
    WHEN duplicate_object OR unique_violation THEN
        NULL;
    WHEN insufficient_privilege THEN
        RAISE EXCEPTION 'role {APP} does not exist and % may not create it', current_user
            USING ERRCODE = 'insufficient_privilege',
                  HINT = 'create it once as a superuser (CREATE ROLE {APP} NOLOGIN) or grant CREATEROLE '
                         'to the migrating user, then run the migration again';
END
$$
"""


def upgrade() -> None:
    op.execute(CREATE_ROLE)
    # Start from nothing: docker-compose's default privileges grant every row privilege on new
    # tables; this revision narrows them to what each table needs.
    op.execute(f"REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {APP}")
    op.execute(f"REVOKE CREATE ON SCHEMA {S} FROM {APP}")
    op.execute(f"GRANT USAGE ON SCHEMA {S} TO {APP}")
    for table, privileges in PRIVILEGES.items():
        op.execute(f"GRANT {privileges} ON {S}.{table} TO {APP}")
    # Identity columns draw from sequences; nextval needs USAGE.
    op.execute(f"GRANT USAGE, SELECT ON ALL SEQUENCES IN SCHEMA {S} TO {APP}")
    op.execute(f"GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA {S} TO {APP}")


def downgrade() -> None:
    op.execute(f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{APP}') THEN
        REVOKE ALL ON ALL TABLES IN SCHEMA {S} FROM {APP};
        REVOKE ALL ON ALL SEQUENCES IN SCHEMA {S} FROM {APP};
        REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {S} FROM {APP};
        REVOKE ALL ON SCHEMA {S} FROM {APP};
    END IF;
END
$$
""")
