"""What must hold after any run, however it failed, once reconciliation has settled it.

Each invariant is one read-only SQL query that counts violations; zero means it holds. The
checker never repairs: it is the judge of the drill (``make chaos``) and of the tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import sqlalchemy as sa


@dataclass(frozen=True, slots=True)
class Invariant:
    name: str
    description: str
    violations: int

    @property
    def holds(self) -> bool:
        return self.violations == 0


# Each query counts violating rows; :batches filters to the drill's batches (NULL = all).
IN_SCOPE = "(CAST(:batches AS text[]) IS NULL OR j.batch_key = ANY(CAST(:batches AS text[])))"

CHECKS: dict[str, tuple[str, str]] = {
    "one_job_per_key": (
        "one job per idempotency key",
        f"SELECT count(*) FROM (SELECT j.idempotency_key FROM triage.jobs j WHERE {IN_SCOPE}"
        " GROUP BY 1 HAVING count(*) > 1) d",
    ),
    "all_settled": (
        "every job completed, manual_review or terminal_failed",
        f"SELECT count(*) FROM triage.jobs j WHERE {IN_SCOPE}"
        " AND j.status NOT IN ('completed', 'manual_review', 'terminal_failed')",
    ),
    "completed_once": (
        "at most one transition into completed per job",
        f"SELECT count(*) FROM (SELECT e.job_id FROM triage.job_events e JOIN triage.jobs j ON j.id = e.job_id"
        f" WHERE {IN_SCOPE} AND e.to_status = 'completed' GROUP BY 1 HAVING count(*) > 1) d",
    ),
    "labels_match_completed": (
        "document_labels equal the completed jobs (every completed document has a label from a"
        " completed job, no label without one)",
        f"SELECT (SELECT count(*) FROM triage.jobs j WHERE {IN_SCOPE} AND j.status = 'completed'"
        "   AND NOT EXISTS (SELECT 1 FROM triage.document_labels l JOIN triage.jobs lj ON lj.id = l.job_id"
        "                   WHERE l.source = j.source AND l.external_id = j.external_id AND lj.status = 'completed'))"
        f" + (SELECT count(*) FROM triage.document_labels l JOIN triage.jobs j ON j.id = l.job_id"
        f"   WHERE {IN_SCOPE} AND j.status <> 'completed')",
    ),
    "no_lease_outstanding": (
        "no lease outstanding",
        f"SELECT count(*) FROM triage.jobs j WHERE {IN_SCOPE} AND (j.lease_token IS NOT NULL OR j.status = 'running')",
    ),
    "one_open_review_per_review_job": (
        "every manual_review job has exactly one open review row with a reason, and no other job has one",
        f"SELECT count(*) FROM triage.jobs j WHERE {IN_SCOPE} AND (j.status = 'manual_review') <>"
        " ((SELECT count(*) FROM triage.manual_review r WHERE r.job_id = j.id AND r.resolved_at IS NULL"
        "   AND r.reason <> '') = 1)",
    ),
    "one_published_event_per_completion": (
        "exactly one published job.completed event per completion",
        f"SELECT count(*) FROM triage.jobs j WHERE {IN_SCOPE} AND"
        " (SELECT count(*) FROM triage.job_events e WHERE e.job_id = j.id AND e.to_status = 'completed') <>"
        " (SELECT count(*) FROM triage.outbox o WHERE o.job_id = j.id AND o.event_type = 'job.completed'"
        "   AND o.published_at IS NOT NULL)",
    ),
}


def check_invariants(conn: sa.Connection, batches: list[str] | None = None,
                     effects_per_key: Mapping[str, int] | None = None) -> list[Invariant]:  # fmt: skip
    """Count the violations of every invariant (of ``batches``, or of every job).

    :param effects_per_key: how many different effects an external sink was asked for under
        each idempotency key (asking again for the same one is the retry the key exists for);
        each must be at most one.
    """
    results = [
        Invariant(name, description, int(conn.execute(sa.text(sql), {"batches": batches}).scalar_one()))
        for name, (description, sql) in CHECKS.items()
    ]
    if effects_per_key is not None:
        results.append(Invariant("external_effect_once", "the external sink saw one effect per idempotency key",
                                 sum(1 for n in effects_per_key.values() if n > 1)))  # fmt: skip
    return results


def format_invariants(results: list[Invariant]) -> str:
    width = max(len(r.description) for r in results)
    lines = [f"{'invariant':<{width}}  {'violations':>10}  verdict"]
    lines += [f"{r.description:<{width}}  {r.violations:>10}  {'ok' if r.holds else 'BROKEN'}" for r in results]
    return "\n".join(lines)
