"""One reconciliation run: record it, run every rule, build the report, record the outcome.

    from triage.reconciliation.runner import reconcile
    outcome = reconcile(store, ReconcileParams(dry_run=True), publish=sink.publish, api=None,
                        reports_dir="/tmp/reports")

The run's row in ``triage.reconciliation_runs`` is written first (so a run that dies is visible
as unfinished) and completed last with the findings, the repairs, the JSON summary and the
HTML page's path (NULL when rendering degraded).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import reconciliation_runs
from triage.jobs.store import JobStore
from triage.ports.airflow_states import AirflowStates
from triage.reconciliation import airflow_view, outage_resumes, render, reporting, rules
from triage.reconciliation.findings import RuleResult
from triage.reconciliation.params import ReconcileParams

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunOutcome:
    run_id: int
    summary: dict[str, Any]  # the JSON summary (XCom, the runs table)
    markdown: str
    html_path: Path | None  # None: the page could not be rendered (see render.write_html_report)
    results: tuple[RuleResult, ...]


@cache
def start_run() -> Any:
    return (
        sa.insert(reconciliation_runs)
        .values(dry_run=sa.bindparam("dry_run"), params=sa.bindparam("params"), dag_run_id=sa.bindparam("dag_run_id"))
        .returning(reconciliation_runs.c.id, reconciliation_runs.c.started_at)
    )


@cache
def finish_run() -> Any:
    """Complete a run's row once; a finished row is never rewritten."""
    return (
        sa.update(reconciliation_runs)
        .where(reconciliation_runs.c.id == sa.bindparam("run_id"), reconciliation_runs.c.finished_at.is_(None))
        .values(
            finished_at=sa.bindparam("finished_at"),
            findings=sa.bindparam("findings"),
            repairs=sa.bindparam("repairs"),
            summary=sa.bindparam("summary"),
            report_path=sa.bindparam("report_path"),
        )
        .returning(reconciliation_runs.c.id)
    )


@cache
def latest_run() -> Any:
    """The newest finished run: ``make run`` and the UI point at its report."""
    return (
        sa.select(reconciliation_runs)
        .where(reconciliation_runs.c.finished_at.is_not(None))
        .order_by(reconciliation_runs.c.id.desc())
        .limit(1)
    )


def _now(store: JobStore) -> datetime:
    with store.reading() as conn:
        return conn.execute(sa.select(sa.func.now())).scalar_one()


def run_rules(
    store: JobStore,
    params: ReconcileParams,
    *,
    publish: rules.Publish | None,
    api: AirflowStates | None,
    classifier_versions: Collection[str] | None = None,
    runs: outage_resumes.DagRuns | None = None,
    final_try: int | None = None,
) -> tuple[RuleResult, ...]:
    """Every rule, in an order where each sees the previous ones' repairs: leases first (a
    rescued job is no longer "running", nor its lease live), then Airflow's view (it counts what
    is left), the resumes of parked work, the jobs of dead last tries and the orphans: what no
    rule with more knowledge settled; and the outbox last, so that the events the repairs wrote
    (``job.needs_review``, ``job.completed``) are relayed in the same run once they are old
    enough."""
    results = [
        rules.expired_leases(store, params),
        rules.stuck_work(store, params, classifier_versions),
        rules.consistency(store, params),
    ]
    view = airflow_view.airflow_view(store, params, api)
    results += [
        view,
        outage_resumes.outage_resumes(store, params, runs),
        # After the Airflow view (its repairs know why), before the orphans (a narrower reason).
        # Where the view ran, its DAG's dead tries are its own to judge (it knows the other runs).
        rules.dead_last_tries(store, params, final_try, view.skipped, None if view.skipped else airflow_view.DAG_ID),
        rules.orphaned_work(store, params),
        rules.outbox(store, params, publish),
    ]
    for result in results:
        log.info(
            "rule=%s findings=%d repairs=%d conflicts=%d skipped=%s",
            result.rule,
            len(result.findings),
            sum(r.count for r in result.repairs),
            sum(c.count for c in result.conflicts),
            result.skipped,
        )
    return tuple(results)


def reconcile(
    store: JobStore,
    params: ReconcileParams,
    *,
    publish: rules.Publish | None = None,
    api: AirflowStates | None = None,
    reports_dir: str | os.PathLike[str] | None = None,
    classifier_versions: Collection[str] | None = None,
    runs: outage_resumes.DagRuns | None = None,
    dag_run_id: str | None = None,
    final_try: int | None = None,
) -> RunOutcome:
    """Run every rule (repairing unless ``params.dry_run``), write the report, record the run.

    :param classifier_versions: the versions of the deployment's classifiers; jobs waiting for
        any other are reported (``version_mismatch``). None: not checked.
    :param runs: Airflow's DAG runs (state, paused), to plan the resumes of work parked on an
        outage (:mod:`.outage_resumes`); None: parked work is reported, nothing planned.
    :param final_try: the try number of the classifying tasks' last try (their retries + 1): a
        retryable job whose last holder was such a try is settled by :func:`rules.dead_last_tries`
        once nobody came back for it. None: that rule is skipped.
    :param dag_run_id: the Airflow run of ``reconcile_jobs`` doing this (the report tab of its
        run page finds the report by it); None outside Airflow.
    """
    with store.transaction(None) as conn:
        run_id, started_at = conn.execute(
            start_run(),
            {"dry_run": params.dry_run, "params": params.model_dump(mode="json"), "dag_run_id": dag_run_id},
        ).one()
    results = run_rules(
        store,
        params,
        publish=publish,
        api=api,
        classifier_versions=classifier_versions,
        runs=runs,
        final_try=final_try,
    )
    with store.reading() as conn:
        ledger = reporting.ledger_view(conn, params)
    finished_at = _now(store)
    summary = reporting.summary(
        run_id=run_id, started_at=started_at, finished_at=finished_at, params=params, results=results, ledger=ledger
    )
    html_path = None
    if reports_dir is not None:
        html_path = render.write_html_report(summary, render.report_file(reports_dir, run_id, started_at))
    summary["html"] = {"path": str(html_path) if html_path else None, "rendered": html_path is not None}
    text = render.markdown(summary)
    _record(store, run_id, finished_at, results, summary, html_path)
    return RunOutcome(run_id, summary, text, html_path, results)


def _record(
    store: JobStore,
    run_id: int,
    finished_at: datetime,
    results: Sequence[RuleResult],
    summary: dict[str, Any],
    html_path: Path | None,
) -> None:
    rules_json = [r.as_dict() for r in results]
    findings = [{k: v for k, v in r.items() if k != "repairs"} for r in rules_json]
    with store.transaction(None) as conn:
        conn.execute(
            finish_run(),
            {
                "run_id": run_id,
                "finished_at": finished_at,
                "findings": findings,
                "repairs": summary["repairs"],
                "summary": json.loads(json.dumps(summary, default=str)),
                "report_path": str(html_path) if html_path else None,
            },
        )
