"""The drill's outage phase: the model down for longer than every Airflow retry, then back,
and ``reconcile_jobs`` finishing the date's work with no human action.

One more date (the day before the drill's first) is run with the ``llm`` classifier against the
drill's model on loopback (:class:`~triage_tools.drill.model.FakeModel`), which is down from the
drill's start: every call is answered ``503`` with ``Retry-After: 2``, so each of ``classify``'s
tries opens its circuit breaker, parks the batch (``waiting``, ``outage:model``, due two seconds
later, no attempt spent) and its retry policy brings the next try after the hint. The run must
fail, visibly, and send nothing to review.

While the model is still down, the drill starts ``reconcile_jobs`` itself
(``--outage-resumes-while-down``, once by default) as soon as the parked jobs are due: it must
resume the failed run (clear it through the Task SDK), and the resumed run, meeting the same
outage, must fail again and park its jobs again, still spending nothing. A scheduled
``reconcile_jobs`` does the same whenever a quarter hour falls inside an outage; the drill makes
it happen every time instead of by the clock.

The model is back once the last-try case is over (it shares the model: its kill ends the outage)
or at once without that case. The drill runs nothing of the date by hand: it starts
``reconcile_jobs`` (:func:`heal`), which must resume the run again, and the run must now succeed.
A scheduled ``reconcile_jobs`` may resume it first, whenever it falls; the drill accepts that (it
then finds nothing left to resume). Every wait here has the drill's deadline and names what it
waited for.

Judged by :func:`outage_invariants`: no job of the date ever entered ``manual_review`` (the outage
is not the jobs' fault), each was classified on its first real attempt (neither the outage nor
the resumes spent one), the run failed while the model was down (first, and after each forced
resume), and reconciliation resumed it to success with no run of the date cleared by hand.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa

from triage.jobs.schema import classifications, job_events, jobs, reconciliation_runs
from triage.jobs.sql.expressions import parked
from triage.jobs.sql.reads.checks import in_state
from triage.jobs.vocabulary.states import UNFINISHED
from triage.jobs.vocabulary.states import JobStatus as S
from triage.reconciliation.outage_resumes import RESUME, RULE, planned_resumes
from triage_tools.drill.invariants import Invariant
from triage_tools.drill.report import say
from triage_tools.run import batch_key_of

if TYPE_CHECKING:
    from triage_tools.drill.chaos import Drill

MODEL_VERDICTS = ("inconclusive", "rejected_output")
"""Review reasons that are the model's answer about a document (:mod:`triage.pipeline.classify`)."""

HEAL_ROUNDS = 3
"""``reconcile_jobs`` runs the drill starts once the model is back before it leaves the date to
the settling rounds (and the invariants): one is enough unless a scheduled run got there first."""


@dataclass(frozen=True)
class OutagePhase:
    day: date
    documents: int
    seed: int

    @property
    def outage_run(self) -> str:
        return f"chaos_outage__{self.day.isoformat()}"

    @property
    def batch_key(self) -> str:
        return batch_key_of(self.day)

    def outage_conf(self) -> dict[str, Any]:
        # No injected fault: the outage is the model's own (the drill's FakeModel is down).
        return {"documents": self.documents, "classifier": "llm", "drill": {"seed": self.seed}}


@dataclass
class OutageRecord:
    """What the drill saw of the outage's run, for :func:`outage_invariants`.

    :param forced: resumes the drill asked of ``reconcile_jobs`` while the model was down.
    """

    forced: int = 0
    first_state: str | None = None
    while_down: list[str] = field(default_factory=list)
    """How the run ended after each resume the drill forced while the model was down."""
    healed_by: list[str] = field(default_factory=list)
    """The drill's ``reconcile_jobs`` runs that resumed it once the model was back."""
    cleared_by_hand: bool = False
    """The drill's settling rounds cleared the run, as an operator would: a violation."""


def unfinished_and_parked(conn: sa.Connection, phase: OutagePhase) -> tuple[int, int, float]:
    """(unfinished jobs, parked jobs, seconds until the last parked job is due) of the date."""
    last_due = sa.func.max(jobs.c.next_attempt_at).filter(parked())
    unfinished, n_parked, seconds = conn.execute(
        sa.select(
            sa.func.count().filter(in_state(*UNFINISHED)),
            sa.func.count().filter(parked()),
            sa.func.coalesce(sa.func.extract("epoch", last_due - sa.func.now()), 0.0),
        ).where(jobs.c.batch_key == phase.batch_key)
    ).one()
    return int(unfinished), int(n_parked), float(seconds)


def resume_decision(conn: sa.Connection, reconcile_run_id: str, batch_key: str) -> tuple[str, str]:
    """What one ``reconcile_jobs`` run decided about the batch (its ``outage_parked`` finding):
    ``(decision, why)``, or ``("none", …)`` when it found nothing parked there."""
    summary = conn.execute(
        sa.select(reconciliation_runs.c.summary).where(
            reconciliation_runs.c.dag_run_id == reconcile_run_id, reconciliation_runs.c.finished_at.is_not(None)
        )
    ).scalar_one_or_none()
    for rule in (summary or {}).get("rules", []):
        for finding in rule["findings"] if rule["rule"] == RULE else []:
            if finding["data"].get("batch_key") == batch_key:
                return str(finding["data"]["decision"]), str(finding["detail"])
    return "none", f"{reconcile_run_id} found nothing of {batch_key} parked"


def resumes_planned(conn: sa.Connection, batch_key: str) -> int:
    """How many ``reconcile_jobs`` runs (the drill's and scheduled ones) resumed the batch."""
    summaries = conn.execute(sa.select(reconciliation_runs.c.summary).where(reconciliation_runs.c.dry_run.is_(False)))
    return sum(1 for (s,) in summaries for plan in planned_resumes(s or {}) if plan["batch_key"] == batch_key)


# -- the drill's steps -----------------------------------------------------------------------


def _wait_due(drill: Drill, phase: OutagePhase) -> tuple[int, int]:
    """Wait until every parked job of the date is due; (unfinished, parked) then."""
    while True:
        with drill.engine.connect() as conn:
            unfinished, n_parked, due_in = unfinished_and_parked(conn, phase)
        if due_in <= 0:
            return unfinished, n_parked
        if time.monotonic() + due_in > drill.deadline:
            raise TimeoutError(
                f"the {n_parked} parked jobs of {phase.batch_key} are due in {due_in:.0f} s, past the drill's deadline"
            )
        time.sleep(min(due_in + 0.5, 5.0))


def _resume(drill: Drill, phase: OutagePhase, reconcile_run_id: str) -> tuple[str, str | None]:
    """One ``reconcile_jobs`` run of the drill; its decision about the date and, when it resumed
    the outage's run, how that run then ended."""
    before = drill.run_info(phase.outage_run)
    drill.reconcile(reconcile_run_id)
    with drill.engine.connect() as conn:
        decision, why = resume_decision(conn, reconcile_run_id, phase.batch_key)
    say(f"{reconcile_run_id}: {decision}: {why}")
    if decision != RESUME:
        return decision, None
    return decision, drill.wait_rerun(phase.outage_run, before)


WAIT_DECISIONS = frozenset({"run_active", "leased", "not_due"})
"""Decisions a later ``reconcile_jobs`` run may turn into a resume: a scheduled run resumed the
date just before the drill's (its run is active), or its jobs are not all due yet."""


def resume_while_down(drill: Drill, phase: OutagePhase, record: OutageRecord) -> None:
    """Force ``record.forced`` resumes of the failed outage run while the model is still down;
    each must be planned, and the run must fail again. A scheduled ``reconcile_jobs`` that
    resumed it first only makes the drill wait and ask again (a few times at most)."""
    record.first_state = drill.first_states.get(phase.outage_run)
    asked = 0
    while len(record.while_down) < record.forced:
        asked += 1
        drill.wait_runs([phase.outage_run])  # a scheduled resume may have it running
        unfinished, n_parked = _wait_due(drill, phase)
        if not n_parked:
            raise RuntimeError(f"{phase.outage_run} left no job parked ({unfinished} unfinished): no outage to resume")
        run_id = f"chaos_reconcile_outage_down__{asked}"
        decision, ended = _resume(drill, phase, run_id)
        if decision != RESUME:
            if decision in WAIT_DECISIONS and asked < record.forced + 3:
                continue
            raise RuntimeError(f"{run_id} did not resume {phase.outage_run} while the model was down: {decision}")
        record.while_down.append(str(ended))
        drill.faults.fault(
            "outage_resume_while_down",
            phase.outage_run,
            f"{run_id} resumed it with the model down ({n_parked} parked); it ended {ended}",
        )


def heal(drill: Drill, phase: OutagePhase, record: OutageRecord) -> None:
    """The model is back: ``reconcile_jobs`` (the drill's, or a scheduled one that comes first)
    resumes the outage's run, which finishes every job of the date."""
    for n in range(1, HEAL_ROUNDS + 1):
        drill.wait_runs([phase.outage_run])
        unfinished, n_parked = _wait_due(drill, phase)
        if not unfinished:
            break
        if not n_parked:  # not the outage's to resume: the settling rounds and the invariants judge it
            say(f"{phase.batch_key}: {unfinished} unfinished, none parked; left to reconciliation")
            break
        run_id = f"chaos_reconcile_outage_back__{n}"
        decision, ended = _resume(drill, phase, run_id)
        if decision == RESUME:
            record.healed_by.append(run_id)
            say(f"the model is back: {run_id} resumed {phase.outage_run}, which ended {ended}")
    state, _ = drill.run_info(phase.outage_run)
    say(f"the model is back: {phase.outage_run} is {state}")


def outage_invariants(
    conn: sa.Connection, phase: OutagePhase, record: OutageRecord, final_state: str | None
) -> list[Invariant]:
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
    planned = resumes_planned(conn, phase.batch_key)
    down = record.while_down
    invariants = [
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
            f"the run during the outage failed visibly (it was {record.first_state})",
            int(record.first_state != "failed"),
        ),
    ]
    if record.forced:
        invariants.append(
            Invariant(
                "outage_resumed_while_down",
                f"reconcile_jobs resumed it {record.forced}x with the model down; it failed again each time ({down})",
                record.forced - sum(1 for s in down if s == "failed"),
            )
        )
    invariants.append(
        Invariant(
            "outage_healed_by_reconciliation",
            f"reconcile_jobs resumed it once the model was back and it succeeded, nobody cleared it by hand"
            f" (it is {final_state}; {planned} resumes planned, {len(down)} of them with the model down)",
            int(final_state != "success") + int(record.cleared_by_hand) + int(planned <= len(down)),
        )
    )
    return invariants
