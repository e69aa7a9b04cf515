"""Audit samples, reviewers' corrections of completed jobs, and labelled examples held to the taxonomy.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-05

Issue #27, item 5 (quality in production):

- An audit sample is an open ``manual_review`` row (reason ``audit_sample``) of a job that stays
  ``completed``: its label was persisted and published as any other. A reviewer confirms it
  (resolution ``confirmed``) or corrects it (``corrected``): ``resolution_known`` takes both,
  and ``check_review_decision()`` treats them as decisions (the review role's only, a corrected
  or confirmed label an active one of the taxonomy).
- A correction is a move ``completed -> completed``, the review role's: the one transition
  whose state does not change. ``jobs.corrections`` counts a job's corrections; the jobs update
  trigger now takes a change of it as a move (checked against ``job_transitions`` and
  ``transition_roles``, logged in ``job_events`` with the actor, login and reason), so the
  pipeline's login cannot make it, and no other state may change the counter. A correction
  keeps the job closed: it does not take retention's reopen lock.
- ``labelled_examples.label`` references ``taxonomy_labels``: an example's label is one the
  taxonomy has or had. Labels are retired, never deleted, so examples of a retired label stay
  (history), and training skips them (``label_outside_taxonomy``). An example whose label is
  missing from ``taxonomy_labels`` here is kept by adding its label as retired.
- Indexes for the quality figures (triage.reconciliation.quality): the decided reviews by
  ``resolved_at``, and a BRIN index on ``classifications.created_at`` (rows arrive in time
  order; a BRIN index costs the hot path almost nothing).

Grants: nothing new to grant. The review role updates ``jobs`` and ``manual_review`` and inserts
``labelled_examples`` (0021, 0025); the app role inserts the audit rows into ``manual_review``
as it inserts every review row.

Frozen history: this file states the change as made here and imports no current code (it reads
0021's trigger body and 0005's hand-over from those revisions' own files).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

S = "triage"
REVIEW = "triage_review"
FROZEN_TRANSITIONS = "job_transitions_frozen"
FROZEN_ROLES = "transition_roles_frozen"
UPDATE_TRIGGER = f"{S}.jobs_check_update()"


def _revision(name: str) -> ModuleType:
    """An earlier revision's module, by its path: its statements in its own words."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"triage_revision_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _replaced(text: str, old: str, new: str) -> str:
    if text.count(old) != 1:
        raise RuntimeError(f"0021's trigger body changed: {old!r} found {text.count(old)} times")
    return text.replace(old, new)


# 0021's jobs_check_update() with two changes: a change of ``corrections`` is a move too (the
# correction, completed -> completed), and a move that stays terminal reopens nothing.
def _check_update() -> str:
    body = str(_revision("0021_roles_by_job.py").CHECK_UPDATE)
    body = _replaced(
        body,
        "WHERE n.status OPERATOR(pg_catalog.<>) o.status\n",
        "WHERE (n.status OPERATOR(pg_catalog.<>) o.status\n"
        "            OR n.corrections OPERATOR(pg_catalog.<>) o.corrections)\n",
    )
    return _replaced(
        body,
        "WHEN o.status OPERATOR(pg_catalog.=) ANY ('{completed,terminal_failed}'::triage.job_status[])\n",
        "WHEN o.status OPERATOR(pg_catalog.=) ANY ('{completed,terminal_failed}'::triage.job_status[])\n"
        "                     AND n.status OPERATOR(pg_catalog.<>) ALL ('{completed,terminal_failed}'::triage.job_status[])\n",
    )


def _check_review_decision(decisions: str, labelled: str) -> str:
    """0021's ``check_review_decision()`` with the decisions ``decisions`` (SQL list) of which
    ``labelled`` (SQL list) name a label that must be an active one."""
    return f"""
CREATE OR REPLACE FUNCTION {S}.check_review_decision() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF NEW.resolution IN ({decisions})
       AND (TG_OP = 'INSERT'
            OR (OLD.resolution, OLD.resolved_at, OLD.resolved_by, OLD.note, OLD.context)
               IS DISTINCT FROM (NEW.resolution, NEW.resolved_at, NEW.resolved_by, NEW.note, NEW.context)) THEN
        IF NOT triage.login_may('{REVIEW}') THEN
            RAISE EXCEPTION 'login % may not record a review decision (%) for job %: that is role {REVIEW}''s',
                            session_user, NEW.resolution, NEW.job_id
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'manual_review_decision_role';
        END IF;
        IF NEW.resolution IN ({labelled}) AND NOT EXISTS (
            SELECT FROM triage.taxonomy_labels t
             WHERE t.name = NEW.context ->> 'resolved_label' AND t.retired_at IS NULL) THEN
            RAISE EXCEPTION 'label % is not in the taxonomy', quote_literal(NEW.context ->> 'resolved_label')
                USING ERRCODE = 'check_violation', CONSTRAINT = 'manual_review_label_in_taxonomy';
        END IF;
    END IF;
    RETURN NEW;
END
$$
"""


RESOLUTIONS = "'labelled', 'requeued', 'rejected', 'superseded', 'confirmed', 'corrected'"
RESOLUTIONS_0025 = "'labelled', 'requeued', 'rejected', 'superseded'"
DECISIONS = "'labelled', 'requeued', 'rejected', 'confirmed', 'corrected'"
"""The resolutions only a reviewer writes (``superseded`` is reconciliation's)."""
LABELLED = "'labelled', 'confirmed', 'corrected'"
"""The decisions that name a label (``context ->> 'resolved_label'``)."""


def _resolution_check(values: str) -> None:
    op.execute(f"ALTER TABLE {S}.manual_review DROP CONSTRAINT manual_review_resolution_known_check")
    op.execute(
        f"ALTER TABLE {S}.manual_review ADD CONSTRAINT manual_review_resolution_known_check"
        f" CHECK (resolution IS NULL OR resolution IN ({values}))"
    )


def _frozen_rows(statement_transitions: str, statement_roles: str) -> None:
    for table, trigger, statement in (
        ("job_transitions", FROZEN_TRANSITIONS, statement_transitions),
        ("transition_roles", FROZEN_ROLES, statement_roles),
    ):
        op.execute(f"ALTER TABLE {S}.{table} DISABLE TRIGGER {trigger}")
        op.execute(statement)
        op.execute(f"ALTER TABLE {S}.{table} ENABLE TRIGGER {trigger}")


def _replace_update_trigger(body: str) -> None:
    """Redefine the ledger owner's trigger function: taken back, replaced, handed over again (0005)."""
    op.execute(f"ALTER FUNCTION {UPDATE_TRIGGER} OWNER TO CURRENT_USER")
    op.execute(body)
    op.execute(_revision("0005_ledger_owner.py").HAND_OVER)


def upgrade() -> None:
    # A constant default: only the catalog changes, whatever the number of jobs.
    op.execute(f"ALTER TABLE {S}.jobs ADD COLUMN corrections integer NOT NULL DEFAULT 0")
    op.execute(f"ALTER TABLE {S}.jobs ADD CONSTRAINT jobs_corrections_check CHECK (corrections >= 0)")
    op.execute(
        f"COMMENT ON COLUMN {S}.jobs.corrections IS "
        "'Reviewers'' corrections of the completed job''s label: each a move completed -> completed (0026)'"
    )
    _frozen_rows(
        f"INSERT INTO {S}.job_transitions (from_status, to_status) VALUES ('completed', 'completed')",
        f"INSERT INTO {S}.transition_roles (from_status, to_status, role) VALUES ('completed', 'completed', '{REVIEW}')",
    )
    _replace_update_trigger(_check_update())

    _resolution_check(RESOLUTIONS)
    op.execute(_check_review_decision(DECISIONS, LABELLED))

    op.execute(
        f"INSERT INTO {S}.taxonomy_labels (name, retired_at) SELECT DISTINCT e.label, now()"
        f" FROM {S}.labelled_examples e ON CONFLICT (name) DO NOTHING"
    )
    op.execute(
        f"ALTER TABLE {S}.labelled_examples ADD CONSTRAINT labelled_examples_label_fkey"
        f" FOREIGN KEY (label) REFERENCES {S}.taxonomy_labels (name)"
    )

    op.execute(
        f"CREATE INDEX manual_review_resolved_at_idx ON {S}.manual_review (resolved_at) WHERE resolved_at IS NOT NULL"
    )
    op.execute(f"CREATE INDEX classifications_created_at_idx ON {S}.classifications USING brin (created_at)")


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {S}.classifications_created_at_idx")
    op.execute(f"DROP INDEX IF EXISTS {S}.manual_review_resolved_at_idx")
    op.execute(f"ALTER TABLE {S}.labelled_examples DROP CONSTRAINT IF EXISTS labelled_examples_label_fkey")
    op.execute(_check_review_decision("'labelled', 'requeued', 'rejected'", "'labelled'"))
    # Decisions of the kinds 0025 does not know lose their name, not their record.
    op.execute(
        f"ALTER TABLE {S}.manual_review DISABLE TRIGGER manual_review_check_decision;"
        f" UPDATE {S}.manual_review SET resolution = 'superseded',"
        f" context = context || jsonb_build_object('resolution_before_0026', resolution)"
        f" WHERE resolution IN ('confirmed', 'corrected');"
        f" ALTER TABLE {S}.manual_review ENABLE TRIGGER manual_review_check_decision"
    )
    _resolution_check(RESOLUTIONS_0025)
    _replace_update_trigger(str(_revision("0021_roles_by_job.py").CHECK_UPDATE))
    _frozen_rows(
        f"DELETE FROM {S}.job_transitions WHERE from_status = 'completed' AND to_status = 'completed'",
        f"DELETE FROM {S}.transition_roles WHERE from_status = 'completed' AND to_status = 'completed'",
    )
    op.execute(f"ALTER TABLE {S}.jobs DROP COLUMN corrections")
