"""Airflow's view of the work: ``classify_documents`` task instances that failed or are up for
retry while their batch still has unfinished jobs, as Airflow reports them
(:class:`~triage.ports.airflow_states.AirflowStates`: its public REST API, through the adapter
room's client :class:`triage.adapters.airflow_api.AirflowApi`).

When Airflow cannot be asked, :func:`airflow_view` degrades to ``skipped`` with the reason:
Airflow's view is a cross-check, and a reconciliation without it is still worth its other rules.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from triage.jobs.store import JobStore
from triage.jobs.vocabulary.models import REPAIRER
from triage.ports.airflow_states import AirflowApiUnavailable, AirflowStates
from triage.reconciliation.findings import Conflict, Finding, Repair, RuleResult, sample
from triage.reconciliation.params import ReconcileParams
from triage.reconciliation.rules import unfinished_by_batch

DAG_ID = "classify_documents"
WATCHED_STATES = ("failed", "up_for_retry")
ACTIVE_RUN_STATES = frozenset({"queued", "running"})
REASON = "airflow_task_failed"  # the failure callback's reason: the repair does what it would have


def airflow_view(store: JobStore, params: ReconcileParams, api: AirflowStates | None) -> RuleResult:
    """Failed or up-for-retry ``classify_documents`` tasks whose batch has unfinished jobs.

    ``up_for_retry`` is reported: Airflow will try again. ``failed`` is repaired when its run
    is over (``failed``) and no other run of the same batch is queued or running: Airflow gave
    up and the failure callback did not move the batch (a SIGKILLed task never calls it), so
    reconciliation does what the callback would have done, with the same fenced statement
    (:meth:`JobStore.send_batch_to_review`, reason ``airflow_task_failed``; live leases of other
    workers are left alone). Otherwise a failed task with unfinished work is a conflict.
    """
    if api is None:
        return RuleResult("airflow_view", skipped="no Airflow API configured")
    since = datetime.now(UTC) - timedelta(hours=params.airflow_lookback_hours)
    try:
        tis = api.task_instances(DAG_ID, WATCHED_STATES, since)
        runs = api.dag_runs(DAG_ID, since) if tis else {}
    except AirflowApiUnavailable as exc:
        return RuleResult("airflow_view", skipped=f"Airflow's REST API is unavailable: {exc}")
    batch_of = {run_id: run.batch_key for run_id, run in runs.items()}
    watched = {batch_of.get(ti.run_id) for ti in tis}  # only the batches of watched task instances
    unfinished = unfinished_by_batch(store, sorted(b for b in watched if b))
    active = {run.batch_key for run in runs.values() if run.state in ACTIVE_RUN_STATES}
    findings: list[Finding] = []
    repairs: list[Repair] = []
    conflicts: list[Conflict] = []
    for ti in sorted(tis, key=lambda t: (t.run_id, t.task_id, t.map_index)):
        batch = batch_of.get(ti.run_id)
        open_jobs = unfinished.get(batch) if batch else None
        if open_jobs is None:
            continue
        task = ti.task_id + (f"[{ti.map_index}]" if ti.map_index >= 0 else "")  # classify is mapped
        where = f"{ti.run_id}/{task} is {ti.state} (try {ti.try_number}) with batch {batch}"
        data = {
            "run_id": ti.run_id,
            "task_id": ti.task_id,
            "map_index": ti.map_index,
            "state": ti.state,
            "batch_key": batch,
        }
        certain = ti.state == "failed" and runs[ti.run_id].state == "failed" and batch not in active
        findings.append(
            Finding(
                f"task_{ti.state}",
                int(open_jobs.n),
                where,
                sample(open_jobs.job_ids),
                "send_batch_to_review" if certain else None,
                data,
            )
        )
        if ti.state == "failed" and not certain:
            conflicts.append(
                Conflict(
                    "task_failed_run_active",
                    int(open_jobs.n),
                    f"{where}; another run of the batch is active",
                    sample(open_jobs.job_ids),
                )
            )
        if certain and not params.dry_run and batch is not None:
            prefix = f"{DAG_ID}/{ti.run_id}/{ti.task_id}/{ti.map_index}/"
            moved = store.send_batch_to_review(
                batch,
                reason=REASON,
                error=f"{ti.task_id} failed in {ti.run_id}; its failure callback never ran",
                owner_prefix=prefix,
                context={
                    "repaired_by": REPAIRER,
                    "run_id": ti.run_id,
                    "task_id": ti.task_id,
                    "try_number": ti.try_number,
                },
                actor=REPAIRER,
            )
            if moved:
                repairs.append(Repair("batch_sent_to_review", moved, f"{where}: unfinished jobs to manual_review"))
            unfinished.pop(batch, None)
    return RuleResult("airflow_view", findings=tuple(findings), repairs=tuple(repairs), conflicts=tuple(conflicts))
