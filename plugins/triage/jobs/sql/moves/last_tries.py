"""The repair of the jobs a task's dead final try held: sent to review as its failure callback would
have done, fenced on exactly what the check counts (:mod:`triage.jobs.sql.reads.last_tries`).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import jobs
from triage.jobs.sql import state_events as E
from triage.jobs.sql.expressions import MOVED, NOW, status_literal
from triage.jobs.sql.reads.last_tries import RULE, TASK_FAILED, last_holder, last_try_dead
from triage.jobs.vocabulary.models import REPAIRER
from triage.jobs.vocabulary.states import JobStatus as S


@cache
def send_dead_last_tries_to_review() -> Any:
    """The repair: ``retryable_failed -> manual_review`` (``airflow_task_failed``) with the review
    row and the ``job.needs_review`` event, for exactly the jobs of :func:`last_try_dead`
    (re-checked under the row lock): what the dead try's failure callback would have done. The
    review row's context names the rule, the holder, the final try and the threshold."""
    moved = (
        sa.update(jobs)
        .where(*last_try_dead())
        .values(status=status_literal(S.MANUAL_REVIEW), status_reason=TASK_FAILED, next_attempt_at=None, updated_at=NOW)
        .returning(*MOVED, last_holder().label("holder"))
        .cte("moved")
    )
    context = sa.func.jsonb_build_object(
        "repaired_by",
        REPAIRER,
        "rule",
        RULE,
        "ledger_only",
        True,
        "holder",
        moved.c.holder,
        "final_try",
        sa.bindparam("final_try", type_=sa.Integer),
        "threshold_seconds",
        sa.bindparam("threshold", type_=sa.Float),
    )
    return sa.select(moved.c.id).add_cte(*E.entered_review(moved, sa.literal(TASK_FAILED), context))
