"""The store's part ``JobStore.last_tries``: the repair of the jobs a task's dead final try held
(the statements and the conditions are :mod:`triage.jobs.sql.moves.last_tries`).
"""

from __future__ import annotations

import uuid

from triage.jobs.sql.moves.last_tries import send_dead_last_tries_to_review
from triage.jobs.sql.moves.repairs import lock
from triage.jobs.sql.reads.last_tries import viewed_prefix
from triage.jobs.store.ledger import Part
from triage.jobs.vocabulary.models import REPAIRER


class DeadLastTries(Part):
    """The store's repair of dead last tries: its part ``JobStore.last_tries``."""

    def send_dead_last_tries_to_review(
        self, *, idle_seconds: float, final_try: int, viewed_dag: str | None = None
    ) -> list[uuid.UUID]:
        """``retryable_failed -> manual_review`` (``airflow_task_failed``, with its review row) for
        the jobs a task's final try (``final_try``) held when it died, due and in an idle batch
        for ``idle_seconds``; one transaction under the repairs' lock, actor ``reconciliation``.
        ``viewed_dag``: a DAG whose tasks Airflow's view judged (its holders are left to it).
        Returns the ids it moved."""
        with self.transaction(REPAIRER) as conn:
            conn.execute(lock())
            params = {"threshold": idle_seconds, "final_try": final_try, "viewed_prefix": viewed_prefix(viewed_dag)}
            return list(conn.execute(send_dead_last_tries_to_review(), params).scalars())
