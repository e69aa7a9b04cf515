"""Airflow callbacks: idempotent, and never raising.

Callbacks are best-effort in Airflow 3 (a SIGKILLed task never calls one), so each is safe to
run twice and reconciliation is the backstop for the ones that never run.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

TASK_FAILED = "airflow_task_failed"


FINISHED_STATES = frozenset({"success", "failed", "skipped", "upstream_failed", "removed"})


def siblings_active(context: Any) -> bool | None:
    """Whether another map index of this task in this run may still claim work (not finished
    yet, or not even started); None when Airflow cannot say (then assume it may)."""
    ti = context["ti"]
    try:
        states = ti.get_task_states(dag_id=ti.dag_id, task_ids=[ti.task_id], run_ids=[ti.run_id])
    except Exception:  # noqa: BLE001 - outside a task process, or the API is unreachable: unknown
        return None
    mine = f"{ti.task_id}_{ti.map_index}"
    siblings = {k: v for k, v in (states.get(ti.run_id) or {}).items() if k != mine}
    return any(state not in FINISHED_STATES for state in siblings.values())


_UNKNOWN = "?"


def ledger_step(task: Any) -> str | None:
    """The step whose jobs the task works on (``TriageOperator.ledger_step``; a mapped task
    that is not unmapped yet names it on its operator class); :data:`_UNKNOWN` for another task."""
    for holder in (task, getattr(task, "operator_class", None)):
        if holder is not None and hasattr(holder, "ledger_step"):
            return holder.ledger_step
    return _UNKNOWN


def on_task_failure(context: Any) -> None:
    """When Airflow gives up on a task: move its unfinished work to ``manual_review`` with
    reason ``airflow_task_failed`` and the task's error.

    Its work, not its batch's: several runs of one date (a scheduled run, a manual one, a
    backfill) share a batch, so the callback takes only jobs at the task's step
    (``ledger_step``) that this DAG run holds or moved last (its leases, expired ones of its
    tasks, and unleased jobs whose latest move it made); another run's jobs, and jobs a reviewer
    requeued, are left to their owners, and ``reconcile_jobs`` moves a failed batch's rest once
    none of its runs is active. A task that holds no jobs (``publish_events``: its unsent events
    stay in the outbox for the next relay) moves nothing; a task of unknown kind only its own
    leases.

    Jobs parked on a dependency outage (``waiting``, reason ``outage:…``) are never moved: the
    task failed because the dependency is down, not because of them, and the next run of the
    date takes them up again (:mod:`triage.jobs.sql.moves.outages`). Jobs leased by other live tasks are
    left alone. A map index of a mapped task (``classify``)
    takes the unleased jobs only when no sibling map index can still claim them (asked through
    the Task SDK's ``get_task_states``); otherwise it moves only what it held and its run's
    expired leases. The one broad ``except`` of the execution path: a callback that raised
    would hide the task's own error and change nothing.
    """
    try:
        from triage.adapters.ledger_db import DEFAULT_CONN_ID, ledger_engine
        from triage.adapters.task_context import batch_key, map_index, owner_prefix, run_prefix
        from triage.jobs.store import JobStore

        task = context.get("task")
        step = ledger_step(task)
        if step is None:
            log.info("failure callback: %s holds no jobs; nothing to move", getattr(task, "task_id", "the task"))
            return
        conn_id = getattr(task, "triage_conn_id", DEFAULT_CONN_ID)
        error = context.get("exception")
        message = f"{type(error).__name__}: {error}"[:2000] if error is not None else "task failed"
        batch, prefix, ti = batch_key(context), owner_prefix(context), context["ti"]
        engine = ledger_engine(conn_id, pool_size=1)
        try:
            moved = JobStore(engine).send_batch_to_review(
                batch,
                reason=TASK_FAILED,
                error=message,
                owner_prefix=prefix,
                context={"task_id": ti.task_id, "run_id": ti.run_id, "try_number": ti.try_number},
                actor=f"{prefix}failure_callback",
                run_prefix=run_prefix(context),
                step=None if step == _UNKNOWN else step,
                take_unleased=step != _UNKNOWN and (map_index(context) < 0 or siblings_active(context) is False),
            )
        finally:
            engine.dispose()
        log.warning("failure callback moved %d unfinished jobs of %s to manual_review (%s)", moved, batch, TASK_FAILED)
    except Exception:
        log.exception("failure callback could not move the batch's jobs; reconciliation will")
