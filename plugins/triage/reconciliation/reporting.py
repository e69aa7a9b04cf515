"""The report's content: one JSON-ready summary built from the ledger and the rules' results.

The same summary feeds the three forms (Markdown for the task log, the HTML page, the JSON in
XCom and ``triage.reconciliation_runs``), so they can never disagree.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from triage.jobs import checks
from triage.jobs.states import JobStatus
from triage.reconciliation import quality
from triage.reconciliation import report_queries as Q
from triage.reconciliation.findings import RuleResult
from triage.reconciliation.params import ReconcileParams


def _f(value: Any, digits: int = 1) -> float:
    return round(float(value or 0), digits)


def ledger_view(conn: sa.Connection, params: ReconcileParams) -> dict[str, Any]:
    """What the ledger looks like now (after this run's repairs)."""
    window = {"window": params.report_window_hours * 3600.0}
    steps: dict[tuple[str, str], int] = {}
    attempts: dict[int, int] = {}
    for r in conn.execute(Q.counts_by_state_step_and_attempt(), window):  # ordered by state, step
        steps[r.status, r.step] = steps.get((r.status, r.step), 0) + int(r.n)
        attempts[int(r.attempt)] = attempts.get(int(r.attempt), 0) + int(r.n)
    by_state_step = [{"status": status, "step": step, "count": n} for (status, step), n in steps.items()]
    by_state = {s.value: 0 for s in JobStatus}
    for (status, _), n in steps.items():
        by_state[status] += n
    queue = conn.execute(Q.review_queue(), {"limit": params.review_queue_limit}).all()
    lag = conn.execute(checks.outbox_lag(), {"threshold": float(params.outbox_age_seconds)}).one()
    return {
        "jobs": sum(by_state.values()),
        "by_state": by_state,
        "by_state_and_step": by_state_step,
        "queue_age": [
            {"status": r.status, "count": int(r.n), "oldest_seconds": _f(r.oldest)}
            for r in conn.execute(Q.oldest_per_state())
        ],
        "time_in_state": [
            {
                "status": r.status,
                "transitions": int(r.n),
                "median_seconds": _f(r.median, 3),
                "p95_seconds": _f(r.p95, 3),
            }
            for r in conn.execute(Q.time_in_state(), window)
        ],
        "attempts": [{"attempt": a, "count": attempts[a]} for a in sorted(attempts)],
        "retry_reasons": [{"reason": r.reason, "count": int(r.n)} for r in conn.execute(Q.retry_reasons(), window)],
        "review_queue": {
            "total": int(queue[0].total) if queue else 0,
            "rows": [
                {
                    "job_id": str(r.job_id),
                    "batch_key": r.batch_key,
                    "reason": r.reason,
                    "attempts": int(r.attempts),
                    "last_error_class": r.last_error_class,
                    "age_seconds": _f(r.age_seconds),
                }
                for r in queue
            ],
        },
        "schema_mismatches": [
            {"found_by": r.found_by, "status": r.status, "count": int(r.n)} for r in conn.execute(Q.schema_mismatches())
        ],
        "rejected_outputs": [
            {"reason": r.reason, "count": int(r.n)} for r in conn.execute(Q.rejected_outputs(), window)
        ],
        "outbox": {"unsent": int(lag.unsent), "oldest_seconds": _f(lag.oldest_seconds), "old": int(lag.old)},
        "quality": quality.figures(conn),
    }


def summary(
    *,
    run_id: int,
    started_at: datetime,
    finished_at: datetime,
    params: ReconcileParams,
    results: Sequence[RuleResult],
    ledger: dict[str, Any],
) -> dict[str, Any]:
    """The JSON summary of one run: the run, every rule's result, and the ledger view."""
    rules = [r.as_dict() for r in results]
    repairs = [{"rule": r["rule"], **entry} for r in rules for entry in r["repairs"]]
    conflicts = [{"rule": r["rule"], **entry} for r in rules for entry in r["conflicts"]]
    return {
        "run": {
            "id": run_id,
            "started_at": started_at.isoformat(),
            "finished_at": finished_at.isoformat(),
            "dry_run": params.dry_run,
            "params": params.model_dump(mode="json"),
        },
        "totals": {
            "jobs": ledger["jobs"],
            "findings": sum(len(r["findings"]) for r in rules),
            "repaired": sum(e["count"] for e in repairs),
            "conflicts": sum(e["count"] for e in conflicts),
            "open_reviews": ledger["review_queue"]["total"],
            "skipped": {r["rule"]: r["skipped"] for r in rules if r["skipped"]},
            "checked": [r["rule"] for r in rules if not r["skipped"]],
        },
        "rules": rules,
        "repairs": repairs,
        "conflicts": conflicts,
        **{k: v for k, v in ledger.items() if k != "jobs"},
    }
