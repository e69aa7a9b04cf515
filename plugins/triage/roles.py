"""Who connects to the job database: the owner migrates; each deployment login does one job.

The group roles are the migrations' (NOLOGIN: rows only, no DDL): ``triage_app`` (0003: the
pipeline), ``triage_review`` (0021: decisions on reviewed jobs) and ``triage_maintenance`` (0021,
0022: retention). On the embedded server a LOGIN member of each is made here, with no password:
``triage_worker`` (connection ``triage_db``), ``triage_reviewer`` (``triage_db_review``: the web
service and ``review_jobs``) and ``triage_maintainer`` (``triage_db_maintenance``:
``triage_maintenance``). pgserver's ``pg_hba.conf`` trusts local connections, and the server
listens only on a Unix socket inside ``$TRIAGE_HOME`` (so whoever can reach the socket can
already read the data files). docker-compose uses the group roles themselves as LOGIN roles with
passwords. Migration 0005 gives the jobs triggers to ``triage_ledger_owner``, that nobody logs in
as. docs/security.md says which role may do what.
"""

from __future__ import annotations

from dataclasses import replace

import psycopg

from triage.database import DatabaseUrl

APP_ROLE = "triage_app"
"""The group role migration 0003 grants row privileges to."""

WORKER_ROLE = "triage_worker"
"""The LOGIN role the embedded deployment's DAGs use (a member of :data:`APP_ROLE`)."""

REVIEW_ROLE = "triage_review"
"""The group role of reviewers' decisions (migration 0021)."""

REVIEWER_ROLE = "triage_reviewer"
"""The LOGIN role of the embedded deployment's web service and ``review_jobs`` (a member of
:data:`REVIEW_ROLE`)."""

MAINTENANCE_ROLE = "triage_maintenance"
"""The group role that alone may run retention (migrations 0021, 0022)."""

MAINTAINER_ROLE = "triage_maintainer"
"""The LOGIN role of the embedded deployment's ``triage_maintenance`` DAG (a member of
:data:`MAINTENANCE_ROLE`)."""

LOGINS = {WORKER_ROLE: APP_ROLE, REVIEWER_ROLE: REVIEW_ROLE, MAINTAINER_ROLE: MAINTENANCE_ROLE}
"""Each embedded login and the group it is a member of."""

LEDGER_OWNER_ROLE = "triage_ledger_owner"
"""Owner of the ``SECURITY DEFINER`` jobs triggers (migration 0005): NOLOGIN, and allowed only to
read ``job_transitions`` and insert into ``job_events``, so the triggers can do nothing else."""

# Roles are cluster-wide and databases are migrated concurrently (tests clone one template per
# session, sessions share a server): a CREATE racing another one fails with unique_violation.
_CREATE_LOGIN = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{login}') THEN
        CREATE ROLE {login} LOGIN INHERIT;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN
    NULL;
END
$$
"""


class AppRoleMissing(RuntimeError):
    """``triage_app`` does not exist yet: apply the migrations (``make migrate``) first."""


def ensure_worker_role(admin: DatabaseUrl) -> None:
    """Create the embedded logins (LOGIN, no password: :data:`LOGINS`), each a member of its
    group; idempotent. A group the migrations have not made yet (below 0021) gets no login yet.

    :param admin: a superuser (or CREATEROLE) connection to any database of the server.
    :raises AppRoleMissing: before migration 0003 ran on this server.
    """
    with psycopg.connect(admin.libpq(), autocommit=True) as conn:
        groups = {
            r[0]
            for r in conn.execute(
                "SELECT rolname FROM pg_catalog.pg_roles WHERE rolname = ANY(%s)", (list(LOGINS.values()),)
            )
        }
        if APP_ROLE not in groups:
            raise AppRoleMissing(AppRoleMissing.__doc__)
        for login, group in LOGINS.items():
            if group not in groups:
                continue
            conn.execute(_CREATE_LOGIN.format(login=login))  # constants, not input
            member = conn.execute("SELECT pg_has_role(%s, %s, 'MEMBER')", (login, group)).fetchone()
            if not (member and member[0]):
                conn.execute(f"GRANT {group} TO {login}")


def login_url(url: DatabaseUrl, login: str) -> DatabaseUrl:
    """``url`` as the embedded ``login`` of :data:`LOGINS` (no password: trusted local socket)."""
    return replace(url, user=login, password=None)


def worker_url(url: DatabaseUrl) -> DatabaseUrl:
    return login_url(url, WORKER_ROLE)


def reviewer_url(url: DatabaseUrl) -> DatabaseUrl:
    return login_url(url, REVIEWER_ROLE)


def maintainer_url(url: DatabaseUrl) -> DatabaseUrl:
    return login_url(url, MAINTAINER_ROLE)
