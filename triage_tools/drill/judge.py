"""The drill's verdict: the ledger's invariants (:mod:`triage_tools.drill.invariants`), each
phase's own, the label provider's record and reconciliation's reach, written into the report."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from triage_tools.drill.chaos import Drill

DAG_ID = "classify_documents"


def judge(drill: Drill) -> None:
    """Count every invariant's violations and the outcomes into ``drill.report``."""
    import sqlalchemy as sa

    from triage.jobs.schema import document_labels, jobs
    from triage.jobs.sql.reads.checks import in_state
    from triage.jobs.vocabulary.states import JobStatus
    from triage_tools.drill.invariants import Invariant, check_invariants

    with drill.engine.connect() as conn:
        drill.report.states = {
            r[0]: int(r[1]) for r in conn.execute(sa.text("SELECT status::text, count(*) FROM triage.jobs GROUP BY 1"))
        }
        drill.report.review_reasons = {
            r[0]: int(r[1])
            for r in conn.execute(
                sa.text("SELECT reason, count(*) FROM triage.manual_review WHERE resolved_at IS NULL GROUP BY 1")
            )
        }
        # The jobs whose label is a document's: an older job of an edited document completes
        # without its action once the newer job's label stands (see triage.pipeline.persist).
        labelled_jobs = {
            str(r[0])
            for r in conn.execute(
                sa.select(document_labels.c.job_id)
                .join_from(document_labels, jobs, jobs.c.id == document_labels.c.job_id)
                .where(in_state(JobStatus.COMPLETED))
            )
        }
        invariants = check_invariants(conn, None, effects_per_key={k: len(v) for k, v in drill.provider.asked.items()})
        if drill.outage is not None:
            from triage_tools.drill.outage import outage_invariants

            record = drill.outage_record
            record.cleared_by_hand = drill.outage.outage_run in drill.cleared
            final = {r: state for r, (state, _) in drill.runs().items()}.get(drill.outage.outage_run)
            invariants += outage_invariants(conn, drill.outage, record, final)
        if drill.last_try is not None:
            from triage_tools.drill.last_try import last_try_invariants

            state = drill.first_states.get(drill.last_try.run_id)
            invariants += last_try_invariants(conn, drill.last_try, drill.faults.last_try_kill, state)
    # The provider's side: one effect per document (a duplicate delivery is one job, so one
    # key), and every document's label reached it (nothing completed without its effect).
    per_document = Counter((b.get("source"), b.get("external_id")) for b in drill.provider.effects.values())
    invariants.append(
        Invariant(
            "one_effect_per_document",
            "the provider applied one label per document",
            sum(1 for n in per_document.values() if n > 1),
        )
    )
    applied_jobs = {str(b.get("job_id")) for b in drill.provider.effects.values()}
    invariants.append(
        Invariant(
            "completed_has_effect", "every document's label reached the provider", len(labelled_jobs - applied_jobs)
        )
    )
    # The backstop reached Airflow every time: a skipped view settles nothing a dead run left.
    view = drill.report.airflow_view
    invariants.append(
        Invariant(
            "airflow_view_checked",
            f"every reconciliation of the drill checked Airflow's view ({json.dumps(dict(view))})",
            sum(n for k, n in view.items() if k != "checked") + int(not view.get("checked")),
        )
    )
    drill.report.invariants = invariants
    drill.report.provider = {
        "requests": sum(drill.provider.requests.values()),
        "effects": len(drill.provider.effects),
        "keys asked more than once": sum(1 for n in drill.provider.requests.values() if n > 1),
        "answered after the client's timeout": drill.provider.late_answers,
    }
    tries: Counter[str] = Counter()
    for run_id in drill.runs():
        with contextlib.suppress(Exception):
            for ti in drill.api.get(f"/api/v2/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances").get("task_instances", []):
                tries[f"{ti['task_id']}: tries"] += int(ti.get("try_number") or 0)
    drill.report.task_tries = dict(tries)
