"""What must hold after any run, however it failed, once reconciliation has settled it.

Each invariant is one read-only query that counts violations; zero means it holds. The
checker never repairs: it is the judge of the drill (``make chaos``) and of the tests.

The queries are built from the ledger's own definitions, never restated: its groups of states
(:mod:`triage.jobs.states`), and the conditions and the completion events of reconciliation's
checks (:mod:`triage.jobs.checks`), so the judge and reconciliation mean the same by "settled",
"running" or "a completion event". The judge asks stricter questions than the checks do: at
rest (no grace), and "exactly one" where a check asks "none missing".
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql as pg
from sqlalchemy.sql.elements import ColumnElement

from triage.jobs.audit_samples import is_open_audit_sample
from triage.jobs.checks import COMPLETION_EVENTS, in_state
from triage.jobs.expressions import status_literal
from triage.jobs.schema import document_labels, job_events, jobs, manual_review, outbox
from triage.jobs.states import SETTLED
from triage.jobs.states import JobStatus as S


@dataclass(frozen=True, slots=True)
class Invariant:
    name: str
    description: str
    violations: int

    @property
    def holds(self) -> bool:
        return self.violations == 0


def in_scope() -> ColumnElement[bool]:
    """The job (``jobs`` in scope) is of the drill's batches: ``:batches``, NULL for every job."""
    batches = sa.bindparam("batches", type_=pg.ARRAY(sa.Text))
    return sa.or_(batches.is_(None), jobs.c.batch_key == sa.any_(batches))


def _count(*where: ColumnElement[bool]) -> sa.Select[Any]:
    """How many jobs of the scope meet ``where``."""
    return sa.select(sa.func.count()).select_from(jobs).where(in_scope(), *where)


def _moves_into_completed() -> Any:
    """The job's transitions into ``completed`` (``job_events``), counted."""
    return (
        sa.select(sa.func.count())
        .where(job_events.c.job_id == jobs.c.id, job_events.c.to_status == status_literal(S.COMPLETED))
        .scalar_subquery()
    )


@cache
def one_job_per_key() -> sa.Select[Any]:
    keys = (
        sa.select(jobs.c.idempotency_key)
        .where(in_scope())
        .group_by(jobs.c.idempotency_key)
        .having(sa.func.count() > 1)
        .subquery()
    )
    return sa.select(sa.func.count()).select_from(keys)


@cache
def all_settled() -> sa.Select[Any]:
    return _count(~in_state(*SETTLED))


@cache
def completed_once() -> sa.Select[Any]:
    return _count(_moves_into_completed() > 1)


@cache
def labels_match_completed() -> sa.Select[Any]:
    """Completed jobs whose document has no label from a completed job, plus labels whose job
    is not completed."""
    labelling = jobs.alias("labelling")
    labelled = sa.exists().where(
        document_labels.c.source == jobs.c.source,
        document_labels.c.external_id == jobs.c.external_id,
        labelling.c.id == document_labels.c.job_id,
        labelling.c.status == status_literal(S.COMPLETED),
    )
    unlabelled = _count(in_state(S.COMPLETED), ~labelled).scalar_subquery()
    stray = (
        sa.select(sa.func.count())
        .select_from(document_labels)
        .join(jobs, jobs.c.id == document_labels.c.job_id)
        .where(in_scope(), ~in_state(S.COMPLETED))
        .scalar_subquery()
    )
    return sa.select(unlabelled + stray)


@cache
def no_lease_outstanding() -> sa.Select[Any]:
    return _count(sa.or_(jobs.c.lease_token.is_not(None), in_state(S.RUNNING)))


@cache
def one_open_review_per_review_job() -> sa.Select[Any]:
    open_rows = (
        sa.select(sa.func.count())
        .where(
            manual_review.c.job_id == jobs.c.id,
            manual_review.c.resolved_at.is_(None),
            manual_review.c.reason != "",
            ~is_open_audit_sample(),  # beside a completed job by design (triage.jobs.audit_samples)
        )
        .scalar_subquery()
    )
    return _count(in_state(S.MANUAL_REVIEW) != (open_rows == 1))


@cache
def one_published_event_per_completion() -> sa.Select[Any]:
    published = (
        sa.select(sa.func.count())
        .where(
            outbox.c.job_id == jobs.c.id, outbox.c.event_type.in_(COMPLETION_EVENTS), outbox.c.published_at.is_not(None)
        )
        .scalar_subquery()
    )
    return _count(_moves_into_completed() != published)


CHECKS: dict[str, tuple[str, Callable[[], sa.Select[Any]]]] = {
    "one_job_per_key": ("one job per idempotency key", one_job_per_key),
    "all_settled": ("every job completed, manual_review or terminal_failed", all_settled),
    "completed_once": ("at most one transition into completed per job", completed_once),
    "labels_match_completed": (
        "document_labels equal the completed jobs (every completed document has a label from a"
        " completed job, no label without one)",
        labels_match_completed,
    ),
    "no_lease_outstanding": ("no lease outstanding", no_lease_outstanding),
    "one_open_review_per_review_job": (
        "every manual_review job has exactly one open review row with a reason, and no other job has one",
        one_open_review_per_review_job,
    ),
    "one_published_event_per_completion": (
        "exactly one published job.completed event per completion",
        one_published_event_per_completion,
    ),
}
"""Each invariant's description (what the drill prints) and the query counting its violations."""


def check_invariants(
    conn: sa.Connection, batches: list[str] | None = None, effects_per_key: Mapping[str, int] | None = None
) -> list[Invariant]:
    """Count the violations of every invariant (of ``batches``, or of every job).

    :param effects_per_key: how many different effects an external sink was asked for under
        each idempotency key (asking again for the same one is the retry the key exists for);
        each must be at most one.
    """
    results = [
        Invariant(name, description, int(conn.execute(query(), {"batches": batches}).scalar_one()))
        for name, (description, query) in CHECKS.items()
    ]
    if effects_per_key is not None:
        results.append(
            Invariant(
                "external_effect_once",
                "the external sink saw one effect per idempotency key",
                sum(1 for n in effects_per_key.values() if n > 1),
            )
        )
    return results


def format_invariants(results: list[Invariant]) -> str:
    width = max(len(r.description) for r in results)
    lines = [f"{'invariant':<{width}}  {'violations':>10}  verdict"]
    lines += [f"{r.description:<{width}}  {r.violations:>10}  {'ok' if r.holds else 'BROKEN'}" for r in results]
    return "\n".join(lines)
