"""Earlier reconciliation runs, read back from ``triage.reconciliation_runs``: one run's stored
summary (by its id, by the Airflow run that made it, or the latest), and the trend across runs.

Every report page renders from these rows, so any API server shows any run: the HTML file a
worker may write beside it is for ``make run`` and nobody depends on it. Reads only.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import sqlalchemy as sa

from triage.jobs.schema import reconciliation_runs as runs
from triage.jobs.vocabulary.states import UNFINISHED

TREND_RUNS = 60
"""How many of the latest finished runs the trend shows."""

_FINISHED = runs.c.finished_at.is_not(None)
_COLUMNS = (runs.c.id, runs.c.dag_run_id, runs.c.started_at, runs.c.finished_at, runs.c.summary)


@cache
def run_by_id() -> sa.Select[Any]:
    return sa.select(*_COLUMNS).where(runs.c.id == sa.bindparam("run_id", type_=sa.BigInteger), _FINISHED)


@cache
def run_by_dag_run() -> sa.Select[Any]:
    """The run an Airflow ``reconcile_jobs`` run made (its newest, should a retry have made two)."""
    return (
        sa.select(*_COLUMNS)
        .where(runs.c.dag_run_id == sa.bindparam("dag_run_id", type_=sa.Text), _FINISHED)
        .order_by(runs.c.id.desc())
        .limit(1)
    )


@cache
def latest() -> sa.Select[Any]:
    return sa.select(*_COLUMNS).where(_FINISHED).order_by(runs.c.id.desc()).limit(1)


@cache
def neighbours() -> sa.Select[Any]:
    """The finished runs just before and after ``:run_id`` (for the report's links)."""
    before = sa.select(sa.func.max(runs.c.id)).where(runs.c.id < sa.bindparam("run_id"), _FINISHED)
    after = sa.select(sa.func.min(runs.c.id)).where(runs.c.id > sa.bindparam("run_id"), _FINISHED)
    return sa.select(before.scalar_subquery().label("before"), after.scalar_subquery().label("after"))


@cache
def trend() -> sa.Select[Any]:
    """The latest ``:limit`` finished runs, oldest first, with the figures the trend plots."""
    totals = runs.c.summary["totals"]
    by_state = runs.c.summary["by_state"]
    unfinished = sum(
        (sa.func.coalesce(by_state[s.value].as_integer(), 0) for s in sorted(UNFINISHED, key=lambda s: s.value)),
        sa.literal(0),
    )
    newest = (
        sa.select(
            runs.c.id,
            runs.c.dag_run_id,
            runs.c.started_at,
            runs.c.dry_run,
            sa.func.coalesce(totals["open_reviews"].as_integer(), 0).label("open_reviews"),
            unfinished.label("unfinished"),
            sa.func.coalesce(totals["repaired"].as_integer(), 0).label("repaired"),
            sa.func.coalesce(totals["conflicts"].as_integer(), 0).label("conflicts"),
            runs.c.summary["quality"]["by_version"].label("quality"),
        )
        .where(_FINISHED)
        .order_by(runs.c.id.desc())
        .limit(sa.bindparam("limit", type_=sa.Integer))
        .subquery()
    )
    return sa.select(newest).order_by(newest.c.id)


def stored_run(
    conn: sa.Connection, *, run_id: int | None = None, dag_run_id: str | None = None
) -> dict[str, Any] | None:
    """A finished run's row (``id``, ``dag_run_id``, times, ``summary``): by id, by its Airflow
    run, or the latest when neither is given; None when there is none."""
    if run_id is not None:
        row = conn.execute(run_by_id(), {"run_id": run_id}).first()
    elif dag_run_id is not None:
        row = conn.execute(run_by_dag_run(), {"dag_run_id": dag_run_id}).first()
    else:
        row = conn.execute(latest()).first()
    if row is None:
        return None
    found = row._asdict()
    before, after = conn.execute(neighbours(), {"run_id": found["id"]}).one()
    return {**found, "before": before, "after": after}


def trend_rows(conn: sa.Connection, limit: int = TREND_RUNS) -> list[dict[str, Any]]:
    """The trend's runs, oldest first; ``quality`` is each run's coverage and audited precision
    per classifier version (``version``, ``coverage``, ``precision``; None: not measured), empty
    for a run that stored no Quality section."""
    rows = []
    for r in conn.execute(trend(), {"limit": limit}):
        row = r._asdict()
        row["quality"] = [
            {"version": q.get("version"), "coverage": q.get("coverage"), "precision": q.get("precision")}
            for q in (row["quality"] or [])
            if isinstance(q, dict)
        ]
        rows.append(row)
    return rows
