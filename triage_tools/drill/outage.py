"""The drill's outage phase: the model down for longer than every Airflow retry, then back.

One more date (the day before the drill's first) is run with every model call failing
transiently (the ``drill`` param's ``transient_error_rate`` 1.0, each failure carrying a
``Retry-After`` of a few seconds, as a 503 would, so the classify task's retries come quickly
through its retry policy). The run must fail, visibly. Then the model is back: a second run of
the same date, with no faults, must finish every job. Judged by :func:`outage_invariants`: no
job of that date ever entered ``manual_review`` (the outage is not the jobs' fault), each
was classified on its first real attempt (the outage spent none), and the outage run failed while the
recovery run succeeded.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import classifications, job_events, jobs
from triage.jobs.states import JobStatus as S
from triage_tools.drill.invariants import Invariant
from triage_tools.run import batch_key_of

MODEL_VERDICTS = ("inconclusive", "rejected_output")
"""Review reasons that are the model's answer about a document (:mod:`triage.pipeline.classify`)."""


@dataclass(frozen=True)
class OutagePhase:
    """:param retry_after_seconds: the ``Retry-After`` each injected failure carries."""

    day: date
    documents: int
    seed: int
    retry_after_seconds: float = 2.0

    @property
    def outage_run(self) -> str:
        return f"chaos_outage__{self.day.isoformat()}"

    @property
    def recovery_run(self) -> str:
        return f"chaos_outage_recovered__{self.day.isoformat()}"

    @property
    def batch_key(self) -> str:
        return batch_key_of(self.day)

    def outage_conf(self) -> dict[str, Any]:
        drill = {"transient_error_rate": 1.0, "seed": self.seed, "retry_after_seconds": self.retry_after_seconds}
        return {"documents": self.documents, "drill": drill}

    def recovery_conf(self) -> dict[str, Any]:
        # The same seed: the synthetic source draws the same documents, so no new job is registered.
        return {"documents": self.documents, "drill": {"seed": self.seed}}


def outage_invariants(conn: sa.Connection, phase: OutagePhase, run_states: dict[str, str]) -> list[Invariant]:
    """What the outage phase must leave: each is a count of violations."""
    of_batch = jobs.c.batch_key == phase.batch_key
    # A model's own verdict on a document (low confidence, unusable output) is a review the
    # classifier asks for once the model is back, not the outage's; every other reason is.
    ever_reviewed = sa.select(sa.func.count(sa.distinct(job_events.c.job_id))).where(
        job_events.c.to_status == S.MANUAL_REVIEW.value,
        job_events.c.reason.not_in(MODEL_VERDICTS),
        job_events.c.job_id.in_(sa.select(jobs.c.id).where(of_batch)),
    )
    judged = sa.and_(jobs.c.status == S.MANUAL_REVIEW.value, jobs.c.status_reason.in_(MODEL_VERDICTS))
    total, unsettled = conn.execute(
        sa.select(
            sa.func.count(), sa.func.count().filter(sa.and_(jobs.c.status != S.COMPLETED.value, sa.not_(judged)))
        ).where(of_batch)
    ).one()
    # Classified at an attempt after the first: an attempt was spent before (persist's own
    # attempts, a late label-provider answer, are not the outage's and are not counted).
    spent = conn.execute(
        sa.select(sa.func.count(sa.distinct(classifications.c.job_id))).where(
            classifications.c.attempt > 1, classifications.c.job_id.in_(sa.select(jobs.c.id).where(of_batch))
        )
    ).scalar_one()
    outage_state, recovery_state = run_states.get(phase.outage_run), run_states.get(phase.recovery_run)
    return [
        Invariant(
            "outage_not_reviewed",
            "no job of the outage's date entered manual_review but for the model's verdict",
            int(conn.execute(ever_reviewed).scalar_one()),
        ),
        Invariant(
            "outage_settled",
            f"every job of the outage's date classified after it ({total} jobs)",
            int(unsettled) + (0 if total else 1),
        ),
        Invariant("outage_spent_no_attempt", "each was classified on its first real attempt", int(spent)),
        Invariant(
            "outage_run_failed",
            f"the run during the outage failed visibly (it was {outage_state})",
            int(outage_state != "failed"),
        ),
        Invariant(
            "outage_recovered",
            f"the next run of the date succeeded (it was {recovery_state})",
            int(recovery_state != "success"),
        ),
    ]
