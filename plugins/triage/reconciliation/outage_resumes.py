"""Work parked on an outage finishes by itself once it is due (issue #13, item 3; issue #25).

A ``classify_documents`` run that stops on a dependency outage parks its batch's unfinished jobs
(``waiting``, reason ``outage:<dependency>``, due at ``next_attempt_at``) and fails once Airflow
gives up its retries. Nothing in that run comes back, and the next scheduled run is another
date's batch. This rule finds each batch whose parked jobs are all due, and plans to clear the
run that parked them last (``reset_dag_run``: retrieval registers nothing new, claims skip what
is done, the classify step queues the parked jobs and tries them); ``reconcile_jobs`` then
clears each planned run through Airflow itself (:mod:`triage.operators.outage_resume`).

``classify_intake`` parks the ``intake`` batch the same way, and nothing else would bring it
back in a quiet deployment (its next run waits for the next post's asset event). Its batch has
no date: the run that parked it is cleared by its run id alone (an asset-triggered run has no
logical date), and any run of the DAG takes the whole batch.

A batch is left alone, and the finding says why, when:

- a parked job is not due yet (``not_due``): its due time is the outage's backoff, so a
  dependency still down is tried again only as often as the parked jobs allow;
- a job of the batch runs under a live lease (``leased``), or a run that moved the batch's
  unfinished jobs last is queued or running (``run_active``): that run takes them up;
- the DAG is paused (``paused``): a cleared run would wait there unseen;
- the run that parked them no longer exists, or was not a ``classify_documents`` task
  (``run_missing``, ``not_a_run``): a conflict, a human runs the date again;
- more batches are due than ``max_outage_resumes`` (``over_limit``): the next run takes them.

The rule reads the ledger only; what Airflow knows of its runs comes through :class:`DagRuns`
(the Task SDK inside Airflow; none outside it, where the rule reports and plans nothing).
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any, Protocol

from triage.contracts.intake import INTAKE_BATCH, INTAKE_DAG_ID
from triage.jobs.sql.reads import checks as Q
from triage.reconciliation.findings import Conflict, Finding, Repair, RuleResult, sample

if TYPE_CHECKING:
    from triage.jobs.store import JobStore
    from triage.reconciliation.params import ReconcileParams

RULE = "outage_resumes"
RESUMABLE_DAG = "classify_documents"
RESUMABLE_DAGS = frozenset({RESUMABLE_DAG, INTAKE_DAG_ID})
"""The DAGs whose runs may be cleared: re-running one of their runs is idempotent."""
ACTIVE_RUN_STATES = frozenset({"queued", "running"})
RESUME = "resume"
"""The decision that plans a resume; :func:`planned_resumes` reads it back from the summary."""


class DagRuns(Protocol):
    """What the rule asks Airflow about its DAG runs."""

    def state(self, dag_id: str, run_id: str) -> str | None:
        """The run's state; None when no such run exists."""
        ...

    def paused(self, dag_id: str) -> bool: ...


def run_of(actor: str) -> tuple[str, str] | None:
    """``(dag_id, run_id)`` of a Triage task's lease owner (``dag/run/task/map_index/tryN``);
    None for any other actor (a reviewer, reconciliation, a script)."""
    parts = actor.split("/")
    if len(parts) != 5 or not parts[4].startswith("try") or not all(parts[:3]):
        return None
    return parts[0], parts[1]


def outage_resumes(store: JobStore, params: ReconcileParams, runs: DagRuns | None) -> RuleResult:
    """Report every batch parked on an outage and plan the resume of each that is all due (at
    most ``params.max_outage_resumes``, the soonest due first); see the module's docstring."""
    with store.reading() as conn:
        batches = conn.execute(Q.parked_outages()).all()
        keys = [b.batch_key for b in batches]
        movers = conn.execute(Q.unfinished_movers(), {"batch_keys": keys}).all() if keys else []
    by_batch: dict[str, list[Any]] = defaultdict(list)
    for mover in movers:
        by_batch[mover.batch_key].append(mover)
    findings: list[Finding] = []
    repairs: list[Repair] = []
    conflicts: list[Conflict] = []
    planned = 0
    for batch in batches:
        parkers = [m for m in by_batch[batch.batch_key] if m.parked_at_event is not None]
        parked_by = max(parkers, key=lambda m: m.parked_at_event).actor if parkers else "nobody"
        holders = sorted({run for m in by_batch[batch.batch_key] if (run := run_of(m.actor)) is not None})
        decision, detail = _decide(batch, run_of(parked_by), parked_by, holders, runs, params, planned)
        target = run_of(parked_by)
        head = f"{batch.n} jobs of {batch.batch_key} parked on an outage"
        data: dict[str, Any] = {
            "batch_key": batch.batch_key,
            "decision": decision,
            "parked_by": parked_by,
            "due_in_seconds": round(max(float(batch.due_in_seconds), 0.0), 1),
        }
        if target is not None:
            data.update(dag_id=target[0], run_id=target[1])
        ids = sample(batch.job_ids)
        repair = "resume_outage_run" if decision == RESUME else None
        findings.append(Finding("outage_parked", int(batch.n), f"{head}: {detail}", ids, repair, data))
        if decision in UNRESUMABLE:
            conflicts.append(Conflict("outage_unresumable", int(batch.n), f"{head}: {detail}", ids))
        if decision == RESUME and target is not None:
            planned += 1
            repairs.append(
                Repair("outage_resume_requested", int(batch.n), f"{'/'.join(target)} cleared to resume them", ids)
            )
    return RuleResult(
        RULE,
        findings=tuple(findings),
        repairs=tuple(repairs),
        conflicts=tuple(conflicts),
        skipped="no Airflow to resume parked work from" if runs is None else None,
    )


UNRESUMABLE = frozenset({"not_a_run", "run_missing"})
"""Decisions no later reconciliation changes: a human runs the date again (a conflict)."""


def _decide(
    batch: Any,
    target: tuple[str, str] | None,
    parked_by: str,
    holders: list[tuple[str, str]],
    runs: DagRuns | None,
    params: ReconcileParams,
    planned: int,
) -> tuple[str, str]:
    """(decision, why) for one parked batch, the cheapest reasons first."""
    again = (
        f"trigger {INTAKE_DAG_ID} (any run of it takes the batch)"
        if batch.batch_key == INTAKE_BATCH
        else "run the date again"
    )
    if batch.due_in_seconds > 0:
        return "not_due", f"the last is due in {float(batch.due_in_seconds):.0f} s"
    if runs is None:
        return "no_airflow", "all due; no Airflow to resume them from"
    if batch.live_leases:
        return "leased", f"all due; {batch.live_leases} jobs of the batch run under a live lease"
    if target is None or target[0] not in RESUMABLE_DAGS:
        return "not_a_run", f"parked by {parked_by}, not a task of {' or '.join(sorted(RESUMABLE_DAGS))}: {again}"
    if runs.paused(target[0]):
        return "paused", f"all due; {target[0]} is paused: unpause it, or {again}"
    state = runs.state(*target)
    if state is None:
        return "run_missing", f"run {target[1]}, which parked them, is gone from Airflow: {again}"
    if state in ACTIVE_RUN_STATES:
        return "run_active", f"all due; run {target[1]} is {state} and takes them up"
    for dag_id, run_id in holders:
        if (dag_id, run_id) != target and (other := runs.state(dag_id, run_id)) in ACTIVE_RUN_STATES:
            return "run_active", f"all due; run {run_id} holds the batch ({other}) and takes them up"
    if planned >= params.max_outage_resumes:
        return "over_limit", f"all due; over max_outage_resumes ({params.max_outage_resumes}): the next run"
    if params.dry_run:
        return "would_resume", f"all due; would clear {target[1]} ({state}) to resume them"
    return RESUME, f"all due; clearing {target[1]} ({state}) to resume them"


def planned_resumes(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The resumes a reconciliation run planned (its JSON summary): ``dag_id``, ``run_id``,
    ``batch_key``, ``parked`` (jobs) each."""
    return [
        {
            "dag_id": f["data"]["dag_id"],
            "run_id": f["data"]["run_id"],
            "batch_key": f["data"]["batch_key"],
            "parked": f["count"],
        }
        for rule in summary.get("rules", [])
        if rule["rule"] == RULE
        for f in rule["findings"]
        if f["data"].get("decision") == RESUME
    ]
