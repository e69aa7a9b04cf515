"""``queued -> completed`` only at step ``classify``: a transition may name the one step it is allowed at.

Revision ID: 0033
Revises: 0032
Create Date: 2026-12-05

Migration 0030 let the app role complete a queued job in the transaction that picks it
(:mod:`triage.pipeline.one_transaction`, ADR 0009): the classifier's answer is the job's
outcome, so the move is right only while the job is at the classify step. The code picks
classify jobs only; the database did not say so, and any app-role statement could complete a
queued job at ``persist`` (its label never written). Here the rule becomes data:

- ``job_transitions.at_step``: the step the job must be at (its ``step`` before the move) for
  the move to be allowed; NULL, at any step. ``(queued, completed)`` is at ``classify``. Only a
  move has a step to be at: a row for a job's creation (``from_status`` NULL) has none
  (``job_transitions_at_step_check``).
- ``jobs_check_update()`` (0026's, taken over from the ledger owner, replaced and handed back as
  0005 does) refuses a listed move at another step with ``refuse_step_move()``: the same error
  as any refused move (``check_violation``, constraint ``job_status_transition``, the DETAIL the
  store parses into ``IllegalTransition``) with the job's step and the move's step named.

Grants: ``refuse_step_move()`` is the ledger owner's to execute (the trigger function runs as
it, SECURITY DEFINER); it only raises, so it runs as its caller. The ledger owner already reads
``job_transitions`` (0005), the new column with it.

Frozen history: this file states the change as made here and imports no current code (it reads
0026's trigger body, and 0005's hand-over, from those revisions' own files).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

from alembic import op

revision = "0033"
down_revision = "0032"
branch_labels = None
depends_on = None

S = "triage"
LEDGER = "triage_ledger_owner"
FROZEN_TRANSITIONS = "job_transitions_frozen"
UPDATE_TRIGGER = f"{S}.jobs_check_update()"
REFUSE = f"{S}.refuse_step_move(uuid, {S}.job_status, {S}.job_status, text, text)"


def _revision(name: str) -> ModuleType:
    """An earlier revision's module, by its path: its statements in its own words."""
    path = Path(__file__).with_name(name)
    spec = importlib.util.spec_from_file_location(f"triage_revision_{path.stem}", path)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


REFUSE_STEP_MOVE = f"""
CREATE FUNCTION {S}.refuse_step_move(job_id uuid, old_status {S}.job_status, new_status {S}.job_status,
                                     step text, at_step text)
RETURNS boolean LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE EXCEPTION 'job % cannot move from % to % at step %: that move is allowed only at step %',
                    job_id, old_status, new_status, coalesce(step, '<none>'), at_step
        USING ERRCODE = 'check_violation', CONSTRAINT = 'job_status_transition',
              DETAIL = format('job_id=%s from=%s to=%s step=%s at_step=%s', job_id, old_status, new_status,
                              coalesce(step, '<none>'), at_step);
END
$$;
COMMENT ON FUNCTION {REFUSE} IS
    'Raises for a move job_transitions allows only at another step (at_step); called by the jobs update trigger.';
"""

# The transition check of 0021's update trigger (unchanged by 0026), and the step check after it:
# a move that is not allowed at all says so first, then one allowed only at another step.
TRANSITION_CHECK = "CASE WHEN t.to_status IS NULL THEN triage.refuse_transition(n.id, o.status, n.status)\n"
STEP_CHECK = (
    "                WHEN t.at_step IS NOT NULL\n"
    "                     AND NOT coalesce(o.step OPERATOR(pg_catalog.=) t.at_step, false)\n"
    "                     THEN triage.refuse_step_move(n.id, o.status, n.status, o.step, t.at_step)\n"
)


def _check_update() -> str:
    """0026's ``jobs_check_update()`` with the step check."""
    body = str(_revision("0026_audit_samples_and_corrections.py")._check_update())
    if body.count(TRANSITION_CHECK) != 1:
        raise RuntimeError(
            f"0026's trigger body changed: {TRANSITION_CHECK!r} found {body.count(TRANSITION_CHECK)} times"
        )
    return body.replace(TRANSITION_CHECK, TRANSITION_CHECK + STEP_CHECK)


def _replace_update_trigger(body: str) -> None:
    """Redefine the ledger owner's trigger function: taken back, replaced, handed over again (0005)."""
    op.execute(f"ALTER FUNCTION {UPDATE_TRIGGER} OWNER TO CURRENT_USER")
    op.execute(body)
    op.execute(_revision("0005_ledger_owner.py").HAND_OVER)


def _transitions(statement: str) -> None:
    op.execute(f"ALTER TABLE {S}.job_transitions DISABLE TRIGGER {FROZEN_TRANSITIONS}")
    op.execute(statement)
    op.execute(f"ALTER TABLE {S}.job_transitions ENABLE TRIGGER {FROZEN_TRANSITIONS}")


def upgrade() -> None:
    op.execute(f"ALTER TABLE {S}.job_transitions ADD COLUMN at_step text")
    op.execute(
        f"ALTER TABLE {S}.job_transitions ADD CONSTRAINT job_transitions_at_step_check"
        " CHECK (at_step IS NULL OR from_status IS NOT NULL)"
    )
    op.execute(
        f"COMMENT ON COLUMN {S}.job_transitions.at_step IS "
        "'The step a job must be at (its step before the move) for the move to be allowed; NULL: any step (0033)'"
    )
    _transitions(
        f"UPDATE {S}.job_transitions SET at_step = 'classify' WHERE from_status = 'queued' AND to_status = 'completed'"
    )
    op.execute(REFUSE_STEP_MOVE)
    op.execute(f"GRANT EXECUTE ON FUNCTION {REFUSE} TO {LEDGER}")
    _replace_update_trigger(_check_update())


def downgrade() -> None:
    _replace_update_trigger(str(_revision("0026_audit_samples_and_corrections.py")._check_update()))
    op.execute(f"DROP FUNCTION IF EXISTS {REFUSE}")
    op.execute(f"ALTER TABLE {S}.job_transitions DROP COLUMN at_step")
