"""Who connects to the job database: the owner migrates, a member of ``triage_app`` runs DAGs.

Migration 0003 creates the group role ``triage_app`` (NOLOGIN: rows only, no DDL). On the
embedded server the DAGs log in as ``triage_worker``, a LOGIN member of it made here, with no
password: pgserver's ``pg_hba.conf`` trusts local connections, and the server listens only on
a Unix socket inside ``$TRIAGE_HOME`` (so whoever can reach the socket can already read the
data files). docker-compose uses ``triage_app`` itself as a LOGIN role with a password.
Migration 0005 gives the jobs triggers to a third role, ``triage_ledger_owner``, that nobody
logs in as.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg

from triage.database import DatabaseUrl

APP_ROLE = "triage_app"
"""The group role migration 0003 grants row privileges to."""

WORKER_ROLE = "triage_worker"
"""The LOGIN role the embedded deployment's DAGs use (a member of :data:`APP_ROLE`)."""

LEDGER_OWNER_ROLE = "triage_ledger_owner"
"""Owner of the ``SECURITY DEFINER`` jobs triggers (migration 0005): NOLOGIN, and allowed only to
read ``job_transitions`` and insert into ``job_events``, so the triggers can do nothing else."""

# Roles are cluster-wide and databases are migrated concurrently (tests clone one template per
# session, sessions share a server): a CREATE racing another one fails with unique_violation.
_CREATE_WORKER = f"""
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{WORKER_ROLE}') THEN
        CREATE ROLE {WORKER_ROLE} LOGIN INHERIT;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$
"""


class AppRoleMissing(RuntimeError):
    """``triage_app`` does not exist yet: apply the migrations (``make migrate``) first."""


def ensure_worker_role(admin: DatabaseUrl) -> None:
    """Create :data:`WORKER_ROLE` (LOGIN, no password) as a member of :data:`APP_ROLE`; idempotent.

    :param admin: a superuser (or CREATEROLE) connection to any database of the server.
    :raises AppRoleMissing: before migration 0003 ran on this server.
    """
    with psycopg.connect(admin.libpq(), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", (APP_ROLE,)).fetchone() is None:
            raise AppRoleMissing(AppRoleMissing.__doc__)
        conn.execute(_CREATE_WORKER)
        member = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (WORKER_ROLE, APP_ROLE)).fetchone()
        if not (member and member[0]):
            conn.execute(f"GRANT {APP_ROLE} TO {WORKER_ROLE}")  # constants, not input


def worker_url(url: DatabaseUrl) -> DatabaseUrl:
    """``url`` as :data:`WORKER_ROLE` (no password: trusted local socket)."""
    return replace(url, user=WORKER_ROLE, password=None)
