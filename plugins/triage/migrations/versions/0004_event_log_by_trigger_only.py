"""Only the jobs triggers write the transition log: the app role loses INSERT on ``job_events``.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30

Until 0003 the triggers ran as the caller, so ``triage_app`` needed INSERT on ``job_events``
and could therefore write an event for a move that never happened. Now the two trigger
functions are ``SECURITY DEFINER`` (they run as the owner of the schema, who may insert) with
a pinned ``search_path``, and the role keeps SELECT only: every row of the log is a state
change the triggers checked against ``job_transitions``. The actor fallback becomes
``session_user`` (inside a definer function ``current_user`` is the owner): the login that
moved the job, as before.

The bodies are 0001's with that one change. Frozen history: this file states them as they
are made here and imports nothing of the current code.
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

S = "triage"
APP = "triage_app"

# {security} and {fallback} differ between upgrade and downgrade; the rest is 0001's text.
CHECK_INSERT = """
CREATE OR REPLACE FUNCTION triage.jobs_check_insert() RETURNS trigger LANGUAGE plpgsql
{security} SET enable_nestloop = off AS $$
DECLARE
    actor text := triage.current_actor();
    reason text := nullif(current_setting('triage.reason', true), '');
BEGIN
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    SELECT n.id, NULL, n.status, n.step, n.attempt, coalesce(actor, {fallback}::text),
           coalesce(reason, n.status_reason)
      FROM new_rows n
      LEFT JOIN triage.job_transitions t ON t.from_status IS NULL AND t.to_status = n.status
     WHERE CASE WHEN t.to_status IS NOT NULL THEN true
                ELSE triage.refuse_transition(n.id, NULL, n.status) END;
    RETURN NULL;
END
$$
"""

CHECK_UPDATE = """
CREATE OR REPLACE FUNCTION triage.jobs_check_update() RETURNS trigger LANGUAGE plpgsql
{security} SET enable_nestloop = off AS $$
DECLARE
    actor text := triage.current_actor();
    reason text := nullif(current_setting('triage.reason', true), '');
BEGIN
    INSERT INTO triage.job_events (job_id, from_status, to_status, step, attempt, actor, reason)
    -- A lease holder's own writes (claim, outcomes) need no SET: the lease owner is the actor.
    SELECT n.id, o.status, n.status, n.step, n.attempt,
           coalesce(actor, n.lease_owner, o.lease_owner, {fallback}::text),
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

DEFINER = "SECURITY DEFINER SET search_path = pg_catalog, pg_temp"


def _if_app_role(statement: str) -> str:
    return f"""
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_catalog.pg_roles WHERE rolname = '{APP}') THEN
        {statement};
    END IF;
END
$$
"""


def upgrade() -> None:
    for body in (CHECK_INSERT, CHECK_UPDATE):
        op.execute(body.format(security=DEFINER, fallback="session_user"))
    op.execute(_if_app_role(f"REVOKE INSERT ON {S}.job_events FROM {APP}"))


def downgrade() -> None:
    for body in (CHECK_INSERT, CHECK_UPDATE):
        op.execute(body.format(security="SECURITY INVOKER", fallback="current_user"))
    op.execute(_if_app_role(f"GRANT INSERT ON {S}.job_events TO {APP}"))
