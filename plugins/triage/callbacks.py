"""Airflow callbacks: idempotent, and never raising.

Callbacks are best-effort in Airflow 3 (a SIGKILLed task never calls one), so each is safe to
run twice and reconciliation is the backstop for the ones that never run.
"""

from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger(__name__)

TASK_FAILED = "airflow_task_failed"


def on_task_failure(context: Any) -> None:
    """When Airflow gives up on a task: move its batch's unfinished jobs to ``manual_review``
    with reason ``airflow_task_failed`` and the task's error.

    Jobs leased by other live tasks are left alone. A map index of a mapped task (``classify``)
    moves only what it held and expired leases: the batch's unleased jobs belong to its
    siblings while any of them runs, and when the whole run has failed ``reconcile_jobs``
    moves them (its Airflow view). The one broad ``except`` of the execution path: a callback
    that raised would hide the task's own error and change nothing.
    """
    try:
        from triage.jobs.store import JobStore
        from triage.operators.base import batch_key, database_url_from_connection, map_index, owner_prefix

        task = context.get("task")
        conn_id = getattr(task, "triage_conn_id", "triage_db")
        error = context.get("exception")
        message = f"{type(error).__name__}: {error}"[:2000] if error is not None else "task failed"
        from triage.database import create_engine

        engine = create_engine(database_url_from_connection(conn_id), pool_size=1)
        try:
            moved = JobStore(engine).send_batch_to_review(
                batch_key(context), reason=TASK_FAILED, error=message, owner_prefix=owner_prefix(context),
                context={"task_id": context["ti"].task_id, "run_id": context["ti"].run_id,
                         "try_number": context["ti"].try_number},
                actor=f"{owner_prefix(context)}failure_callback",
                take_unleased=map_index(context) < 0,
            )  # fmt: skip
        finally:
            engine.dispose()
        log.warning("failure callback moved %d unfinished jobs of %s to manual_review (%s)", moved,
                    batch_key(context), TASK_FAILED)  # fmt: skip
    except Exception:
        log.exception("failure callback could not move the batch's jobs; reconciliation will")
